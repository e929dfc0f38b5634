"""Two agents with different tools in one gateway session, on a template that renders ``tools=``
(Qwen2.5, read from TRL's wheel): each segment keeps the tools it was shown (``Segment.tools``), so
the faithful recording passes the fidelity check, also read back from its JSON record; rendered
with the last agent's tools, the first segment would not match its ids."""

from __future__ import annotations

import copy
import os

import openai
import pytest
from gateway_helpers import ADD_TOOL

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.fidelity import token_fidelity_gap
from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import get_parser
from rollforge.gateway import Gateway
from rollforge.types import Trajectory

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.timeout(120)

LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}


@pytest.fixture
def qwen(tokenizer):
    """The tiny tokenizer with Qwen2.5's chat template and control tokens."""
    qwen = copy.deepcopy(tokenizer)
    qwen.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    qwen.eos_token = "<|im_end|>"
    with open(os.path.join(os.path.dirname(trl.__file__), "chat_templates", "qwen2_5.jinja"), encoding="utf-8") as f:
        qwen.chat_template = f.read()
    renderer = ChatRenderer(qwen)
    assert renderer.family.name == "qwen2_5" and renderer.supports_tools()
    return renderer


async def test_two_agents_with_their_own_tools_are_each_rendered_with_them(qwen):
    backend = ScriptedBackend(lambda request: "Hello!", qwen.tokenizer)
    async with Gateway(backend, qwen, get_parser("hermes"), model_name="tiny") as gateway:
        for agent, tool in (("planner", LOOKUP_TOOL), ("executor", ADD_TOOL)):
            api = openai.AsyncOpenAI(base_url=gateway.base_url("episode", agent=agent), api_key="-", max_retries=0)
            messages = [{"role": "system", "content": f"You are the {agent}."}, {"role": "user", "content": "Go."}]
            await api.chat.completions.create(model="tiny", messages=messages, tools=[tool])
        record = gateway.close_session("episode")
    trajectory = record.trajectory(0, "episode", 1.0)
    plan, work = trajectory.segments
    assert [t["function"]["name"] for t in trajectory.tools] == ["add"]  # the last segment's
    assert [t["function"]["name"] for t in plan.tools] == ["lookup"] and work.tools is None
    assert token_fidelity_gap(trajectory, qwen) is None
    again = Trajectory.from_json(trajectory.to_json())
    assert again.segments[0].tools == plan.tools and token_fidelity_gap(again, qwen) is None
    shown_the_last_tools = Trajectory.from_json(
        {
            **trajectory.to_json(),
            "segments": [{k: v for k, v in s.to_json().items() if k != "tools"} for s in trajectory.segments],
        }
    )
    assert token_fidelity_gap(shown_the_last_tools, qwen).startswith("segment 0: ")
