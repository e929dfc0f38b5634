"""Agent programs as environments: a callable and a subprocess run by the engine against its own
gateway; crashes and hangs fail only their episode; one GRPO step of the tiny model on an agent."""

import json
import sys
import textwrap

import openai
import pytest
from gateway_helpers import ADD_TOOL, CALL_TEXT

from rollforge.chat.render import token_fidelity_gap
from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import ConfigError
from rollforge.gateway import AgentEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import generated_ids
from rollforge.types import Sample

pytestmark = pytest.mark.timeout(180)


async def tool_agent(base_url, row):
    """An agent written for the OpenAI SDK with its own tool loop; reward 1 when it answers right."""
    api = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = list(row["prompt"])
    while True:
        reply = await api.chat.completions.create(model="policy", messages=messages, tools=[ADD_TOOL])
        message = reply.choices[0].message
        messages.append(message.model_dump())
        if not message.tool_calls:
            return 1.0 if str(row["answer"]) in message.content else 0.0
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])})


def samples(n, task="agent"):
    return [
        Sample([{"role": "user", "content": f"What is 1 + 2? ({i})"}], task, {"answer": 3, "id": i}) for i in range(n)
    ]


async def test_the_engine_runs_agents_and_records_their_sessions(backend, renderer):
    result = await arollout(samples(8), {"agent": AgentEnvironment(tool_agent)}, backend, renderer, RolloutConfig())
    end = renderer.stop_token_ids[0]
    for i, trajectory in enumerate(result.trajectories):
        assert trajectory.error is None and trajectory.terminated, trajectory.error
        assert trajectory.turns == 2 and trajectory.rewards == (0.0, 1.0)
        assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert trajectory.messages[1].content == f"What is 1 + 2? ({i})" and trajectory.messages[3].content == "3"
        assert generated_ids(trajectory) == renderer.encode(CALL_TEXT) + [end] + renderer.encode("The sum is 3.") + [
            end
        ]
        assert token_fidelity_gap(trajectory, renderer) is None
    assert result.metrics["mean_total_reward"] == 1.0


async def test_a_sync_agent_runs_on_the_environments_threads(backend, renderer):
    def sync_agent(base_url, row):
        api = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        reply = api.chat.completions.create(model="policy", messages=row["prompt"])
        return 0.5 if reply.choices[0].message.content == "Hello!" else 0.0

    result = await arollout(samples(4), {"agent": AgentEnvironment(sync_agent)}, backend, renderer, RolloutConfig())
    assert [t.total_reward for t in result.trajectories] == [0.5] * 4


async def test_lockstep_waves_do_not_wait_for_agents(backend, renderer):
    """Agents run their own turns: in a lockstep wave beside a step-by-step environment, the
    barrier counts only the latter's episodes."""

    class Echo:
        def reset(self, **row):
            return None

    task_to_env = {"agent": AgentEnvironment(tool_agent), "echo": FactoryEnvironment(Echo)}
    mixed = [s for pair in zip(samples(4), samples(4, task="echo")) for s in pair]
    config = RolloutConfig(mode="lockstep", concurrency=8, step_timeout=10, episode_timeout=30)
    result = await arollout(mixed, task_to_env, backend, renderer, config)
    assert [t.task_name for t in result.trajectories] == ["agent", "echo"] * 4
    assert all(t.error is None for t in result.trajectories), [t.error for t in result.trajectories]
    assert [t.turns for t in result.trajectories] == [2, 1] * 4


AGENT_PROGRAM = """
import json, os, sys
import openai

row = json.load(sys.stdin)
api = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the environment
reply = api.chat.completions.create(model="policy", messages=row["prompt"])
if row["id"] == 1:
    sys.stderr.write("Traceback: the harness fell over\\n")
    sys.exit(3)
print("some log line")
print(json.dumps({"reward": 0.25 if reply.choices[0].message.content == "Hello!" else 0.0}))
"""


async def test_a_subprocess_agent_and_a_crash_that_fails_only_its_episode(backend, renderer, tmp_path):
    program = tmp_path / "agent.py"
    program.write_text(textwrap.dedent(AGENT_PROGRAM))
    env = AgentEnvironment(cmd=[sys.executable, str(program)])
    result = await arollout(samples(3), {"agent": env}, backend, renderer, RolloutConfig())
    ok, crashed, also_ok = result.trajectories
    for trajectory in (ok, also_ok):
        assert trajectory.error is None and trajectory.total_reward == 0.25 and trajectory.turns == 1
        assert token_fidelity_gap(trajectory, renderer) is None
    assert crashed.error.kind == "env_error"
    assert "exited with status 3" in crashed.error.message and "the harness fell over" in crashed.error.message
    assert crashed.turns == 1 and sum(crashed.loss_mask) > 0  # what it generated before failing is kept


async def test_a_hung_agent_is_stopped_and_its_late_requests_refused(backend, renderer, tmp_path):
    import asyncio

    late = []

    async def hangs(base_url, row):
        try:
            await asyncio.sleep(3600)
        finally:
            late.append(base_url)

    result = await arollout(
        samples(2), {"agent": AgentEnvironment(hangs, timeout=0.3)}, backend, renderer, RolloutConfig()
    )
    assert [t.error.kind for t in result.trajectories] == ["episode_timeout"] * 2
    assert "time limit of 0.3s" in result.trajectories[0].error.message
    with pytest.raises(openai.APIConnectionError):  # the gateway closed with the rollout
        await openai.AsyncOpenAI(base_url=late[0], api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "late"}]
        )

    program = tmp_path / "sleeper.py"
    program.write_text("import time\ntime.sleep(3600)\n")
    result = await arollout(
        samples(1),
        {"agent": AgentEnvironment(cmd=[sys.executable, str(program)], timeout=1.0)},
        backend,
        renderer,
        RolloutConfig(),
    )
    assert result.trajectories[0].error.kind == "episode_timeout"


def test_bad_arguments_are_explained():
    with pytest.raises(ConfigError, match="either run"):
        AgentEnvironment()
    with pytest.raises(ConfigError, match="list of strings"):
        AgentEnvironment(cmd="python agent.py")
    with pytest.raises(ConfigError, match="'no-such-agent-program' was not found"):
        AgentEnvironment(cmd=["no-such-agent-program"])
    with pytest.raises(ConfigError, match="cannot be stepped"):
        AgentEnvironment(tool_agent).open(samples(1)[0])
