"""A langgraph react agent (langchain's ``create_agent``, a compiled langgraph graph) over
langchain-openai's ``ChatOpenAI`` pointed at the session's base URL, run through
``AgentEnvironment`` with ``invoke`` and with message streaming, over chat completions and over
the Responses API: a tool round trip, recorded token-exactly, the agent's own answer the reward."""

import pytest
from gateway_helpers import assert_add_round_trip

from rollforge.gateway import AgentEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample

pytest.importorskip("langgraph")  # the `agents` extra (scripts/install.sh installs it)
langchain_agents = pytest.importorskip("langchain.agents")
langchain_openai = pytest.importorskip("langchain_openai")
tool = pytest.importorskip("langchain_core.tools").tool

pytestmark = pytest.mark.timeout(180)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def langgraph_agent(base_url, row):
    """``row["mode"]``: ``invoke`` or ``stream`` (``stream_mode="messages"``: token chunks);
    ``row["responses"]``: ChatOpenAI speaks the Responses API instead of chat completions."""
    model = langchain_openai.ChatOpenAI(
        model="policy", base_url=base_url, api_key="unused", max_retries=0, use_responses_api=row["responses"]
    )
    agent = langchain_agents.create_agent(model, tools=[add])
    question = {"messages": [{"role": "user", "content": row["prompt"][-1]["content"]}]}
    if row["mode"] == "invoke":
        answer = agent.invoke(question)["messages"][-1].text
    else:
        # token chunks of every model call; the tool-calling call streams no text
        answer = "".join(
            chunk.text
            for chunk, meta in agent.stream(question, stream_mode="messages")
            if meta["langgraph_node"] == "model"
        )
    return 1.0 if answer == f"The sum is {row['answer']}." else 0.0


async def test_langgraph_react_agent_trajectories_are_token_exact(backend, renderer):
    rows = [
        {"mode": mode, "responses": responses, "answer": 3}
        for mode in ("invoke", "stream")
        for responses in (False, True)
    ]
    samples = [
        Sample([{"role": "user", "content": f"What is 1 + 2? ({i})"}], "agent", row) for i, row in enumerate(rows)
    ]
    result = await arollout(samples, {"agent": AgentEnvironment(langgraph_agent)}, backend, renderer, RolloutConfig())
    for trajectory in result.trajectories:
        assert_add_round_trip(trajectory, renderer)
