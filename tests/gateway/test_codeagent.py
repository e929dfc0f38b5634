"""A smolagents ``CodeAgent`` run through ``AgentEnvironment``, plain and streamed: its tool calls
are Python code blobs, which smolagents' local executor runs inside the agent program (in the
host's Python process, not in rollforge's sandbox). smolagents stops generation at ``</code>`` and
sends its earlier turns back rewritten (a "Calling tools: [...]" text appended), so each reply
becomes its own segment; every segment still holds what the model was shown and generated."""

import pytest
from test_smolagents import add, policy_model

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import token_fidelity_gap
from rollforge.gateway import AgentEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import generated_ids
from rollforge.types import Sample, Trajectory

smolagents = pytest.importorskip("smolagents")  # the `agents` extra (scripts/install.sh installs it)
pytestmark = pytest.mark.timeout(180)

ADD_CODE = "Thought: add them.\n<code>\nprint(add(1, 2))\n</code>"
ANSWER_CODE = "Thought: the log says 3.\n<code>\nfinal_answer(3)\n</code>"


def code_model(prompt: str) -> str:
    """Runs ``add`` first, then answers once its output came back (smolagents sends it as a user
    message starting with "Observation:")."""
    return ANSWER_CODE if "Observation:" in prompt.rsplit("<|im_start|>user", 1)[-1] else ADD_CODE


def code_agent(base_url, row):
    agent = smolagents.CodeAgent(
        tools=[add], model=policy_model(base_url), max_steps=3, verbosity_level=0, stream_outputs=row["stream"]
    )
    answer = agent.run(row["prompt"][-1]["content"])
    return 1.0 if str(answer) == str(row["answer"]) else 0.0


async def test_smolagents_code_agent_trajectories_are_token_exact(tokenizer, renderer):
    backend = ScriptedBackend(lambda request: code_model(renderer.decode(request.prompt_ids)), tokenizer)
    samples = [
        Sample([{"role": "user", "content": f"What is 1 + 2? ({i})"}], "agent", {"answer": 3, "stream": i == 1})
        for i in range(2)
    ]
    config = RolloutConfig(max_seq_len=8192, max_new_tokens=64)
    result = await arollout(samples, {"agent": AgentEnvironment(code_agent)}, backend, renderer, config)
    for trajectory in result.trajectories:
        assert trajectory.error is None and trajectory.total_reward == 1.0, trajectory.error
        assert trajectory.turns == 2 and len(trajectory.segments) == 2
        assert token_fidelity_gap(trajectory, renderer) is None
        assert token_fidelity_gap(Trajectory.from_json(trajectory.to_json()), renderer) is None
        for segment, code in zip(trajectory.segments, (ADD_CODE, ANSWER_CODE)):
            # generation stopped on smolagents' stop string `</code>`: the reply up to it, no end token
            assert generated_ids(segment) == renderer.encode(code)
            prompt = segment.prompt_length
            assert segment.loss_mask == (0,) * prompt + (1,) * (len(segment.token_ids) - prompt)
        # segment 0 keeps what the model was shown and generated, not smolagents' rewrite of it
        first = trajectory.segments[0].history
        assert [m.role for m in first] == ["system", "user", "assistant"] and first[-1].content == ADD_CODE
        assert trajectory.messages[2].content.startswith(ADD_CODE + "\nCalling tools:")
        assert trajectory.messages[3].content.startswith("Observation:\nExecution logs:\n3\n")  # the executor ran add
