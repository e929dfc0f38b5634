"""A smolagents ``ToolCallingAgent`` run through ``AgentEnvironment``: smolagents sends earlier
assistant turns back rewritten ("Calling tools: [...]" text); each segment still records what the
model was shown and what it generated, so every trajectory is token-exact."""

import pytest

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import token_fidelity_gap
from rollforge.gateway import AgentEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample, Trajectory

smolagents = pytest.importorskip("smolagents")  # the `agents` extra (scripts/install.sh installs it)
tool = smolagents.tool
pytestmark = pytest.mark.timeout(180)

ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
ANSWER_CALL = '<tool_call>\n{"name": "final_answer", "arguments": {"answer": "3"}}\n</tool_call>'
#: smolagents sends ``tool_choice: "required"``: the gateway forces the call's opener (mask 0).
OPENER = '<tool_call>\n{"name": "'


def scripted_model(prompt: str) -> str:
    """Continues the forced opener: calls ``add`` first, then ``final_answer`` once an observation
    came back (smolagents sends tool results as user messages starting with "Observation:")."""
    assert prompt.endswith(OPENER)
    call = ANSWER_CALL if "Observation:" in prompt.rsplit("<|im_start|>user", 1)[-1] else ADD_CALL
    return call.removeprefix(OPENER)


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer.
        b: the second integer.
    """
    return a + b


def policy_model(base_url):
    """smolagents' OpenAI-compatible model on the episode's gateway session."""
    return smolagents.OpenAIServerModel(
        model_id="policy", api_base=base_url, api_key="unused", client_kwargs={"max_retries": 0}
    )


def smolagents_agent(base_url, row):
    agent = smolagents.ToolCallingAgent(tools=[add], model=policy_model(base_url), max_steps=3, verbosity_level=0)
    answer = agent.run(row["prompt"][-1]["content"])
    return 1.0 if str(answer).strip() == str(row["answer"]) else 0.0


async def test_smolagents_tool_calling_agent_trajectories_are_token_exact(tokenizer, renderer):
    backend = ScriptedBackend(lambda request: scripted_model(renderer.decode(request.prompt_ids)), tokenizer)
    samples = [Sample([{"role": "user", "content": f"What is 1 + 2? ({i})"}], "agent", {"answer": 3}) for i in range(3)]
    config = RolloutConfig(max_seq_len=8192, max_new_tokens=64)
    result = await arollout(samples, {"agent": AgentEnvironment(smolagents_agent)}, backend, renderer, config)
    for trajectory in result.trajectories:
        assert trajectory.error is None and trajectory.total_reward == 1.0, trajectory.error
        assert trajectory.turns == 2 and len(trajectory.segments) == 2
        assert token_fidelity_gap(trajectory, renderer) is None
        # segment 0 keeps what the model was shown and generated, not smolagents' rewrite of it
        first = trajectory.segments[0].history
        assert [m.role for m in first] == ["system", "user", "assistant"] and first[-1].content == ADD_CALL
        forced = len(renderer.encode(OPENER))  # after the prompt: the opener out of the loss, then the policy's tokens
        assert trajectory.loss_mask[trajectory.prompt_length - 1 : trajectory.prompt_length + forced + 1] == (0,) * (
            forced + 1
        ) + (1,)
        assert "Calling tools:" in trajectory.messages[2].content
        assert token_fidelity_gap(Trajectory.from_json(trajectory.to_json()), renderer) is None
