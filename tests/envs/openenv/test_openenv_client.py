"""Rollouts against real OpenEnv servers (``create_app``) through rollforge's own WebSocket client."""

from __future__ import annotations

import base64
import json

import pytest

from rollforge.envs.check import acheck_env
from rollforge.envs.openenv import OpenEnvEnvironment
from rollforge.errors import ConfigError, EnvironmentError_
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import AllAtOnce, assert_faithful
from rollforge.types import Sample

pytestmark = pytest.mark.slow


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Task number {i}."}]


def add_until_five(renderer):
    """Call add(n=1) until the last observation says total=5 (the server then ends the episode)."""

    def script(request) -> str:
        return '<tool_call>\n{"name": "add", "arguments": {"n": 1}}\n</tool_call>'

    return script


async def test_multi_turn_rollout_async_and_lockstep_identical_and_faithful(servers, renderer, scripted):
    env = OpenEnvEnvironment(servers.url["counter"])
    samples = [Sample(prompt=prompt(i), task_name="count", row={"seed": i}) for i in range(8)]
    results = {}
    for mode in ("async", "lockstep"):
        config = RolloutConfig(mode=mode, max_turns=8, concurrency=4)
        results[mode] = await arollout(samples, {"count": env}, scripted(add_until_five(renderer)), renderer, config)
    a, b = results["async"].trajectories, results["lockstep"].trajectories
    assert [t.index for t in a] == list(range(8))
    for x, y in zip(a, b):
        assert (x.token_ids, x.loss_mask, x.logprobs, x.rewards, x.messages) == (
            y.token_ids,
            y.loss_mask,
            y.logprobs,
            y.rewards,
            y.messages,
        )
    # the counter starts at seed % 3 and needs 5 - start calls of add(1); the last one is rewarded
    assert [t.turns for t in a] == [5 - i % 3 for i in range(8)]
    assert all(t.terminated and t.error is None and t.total_reward == 1.0 for t in a)
    assert [t.rewards[-1] for t in a] == [1.0] * 8 and all(sum(t.rewards[:-1]) == 0 for t in a)
    first = a[0]
    system, user = first.messages[:2]  # the tiny model's template ignores tools=: described in the system message
    assert '"name": "add"' in system.content and user.content == "Task number 0.\n\nThe counter starts at 0."
    assert [m.content for m in first.messages if m.role == "tool"] == [f"total={k}" for k in range(1, 6)]
    assert first.metadata["total"] == 5
    assert_faithful(a, renderer)


async def test_64_concurrent_sessions_one_per_running_episode(servers, renderer, scripted):
    env = OpenEnvEnvironment(servers.url["counter"])
    samples = [Sample(prompt=prompt(i), task_name="count", row={"seed": i}) for i in range(64)]
    config = RolloutConfig(max_turns=8, concurrency=64)
    # every episode's first generation (after its reset opened its session) waits until all 64 are in flight
    backend = AllAtOnce(scripted(add_until_five(renderer)), 64)
    result = await arollout(samples, {"count": env}, backend, renderer, config)
    assert [t.index for t in result.trajectories] == list(range(64)) and backend.peak == 64
    assert all(t.terminated and t.total_reward == 1.0 for t in result.trajectories)
    # every episode saw 64 live environment instances on the server: one session each, all at once
    assert {t.metadata["live"] for t in result.trajectories} == {64}
    assert_faithful(result.trajectories, renderer)


async def test_single_turn_text_mode(servers, renderer, scripted):
    env = OpenEnvEnvironment(servers.url["quiz"], text_field="answer")
    seeds = [12, 34, 56, 78]  # "What is 2 + 1?", ... ; even episodes answer right, odd ones wrong

    def script(request) -> str:
        question = renderer.decode(request.prompt_ids[-30:])
        a, b = (int(x) for x in question.split("What is ")[-1].split("?")[0].split(" + "))
        return f"The answer is {a + b + request.call % 2}."

    samples = [Sample(prompt=prompt(i), task_name="quiz", row={"seed": s}) for i, s in enumerate(seeds)]
    result = await arollout(
        samples, {"quiz": env}, scripted(script), renderer, RolloutConfig(max_turns=3, concurrency=1)
    )
    assert [t.total_reward for t in result.trajectories] == [1.0, 0.0, 1.0, 0.0]
    assert all(t.turns == 1 and t.terminated for t in result.trajectories)
    assert result.trajectories[0].tools == () and "Error" not in json.dumps(
        result.trajectories[0].to_json()["messages"]
    )
    assert (
        result.trajectories[1].messages[-1].content == "Wrong: 7."
        and result.trajectories[1].messages[-1].role == "user"
    )
    assert_faithful(result.trajectories, renderer)


async def test_validation_and_execution_errors_are_counted_failures_not_crashes(servers, renderer, scripted):
    replies = [
        '<tool_call>\n{"name": "add", "arguments": {"n": "many"}}\n</tool_call>',  # VALIDATION_ERROR
        '<tool_call>\n{"name": "add", "arguments": {"n": 99}}\n</tool_call>',  # EXECUTION_ERROR
        '<tool_call>\n{"name": "subtract", "arguments": {"n": 1}}\n</tool_call>',  # unknown tool
        '<tool_call>\n{"name": "add", "arguments": {"n": 1, "extra": 2}}\n</tool_call>',  # extra field
        '<tool_call>\n{"name": "add", "arguments": {"n": 5}}\n</tool_call>',
    ]
    env = OpenEnvEnvironment(servers.url["counter"])
    result = await arollout(
        [Sample(prompt=prompt(0), task_name="c", row={"seed": 0})],
        {"c": env},
        scripted(lambda r: replies[r.call]),
        renderer,
        RolloutConfig(max_turns=8),
    )
    t = result.trajectories[0]
    assert [f.kind for f in t.failures] == ["tool_bad_arguments", "tool_raised", "tool_unknown", "tool_bad_arguments"]
    assert "n=99 is too large" in t.failures[1].message and "n:" in t.failures[0].message
    tool_messages = [m.content for m in t.messages if m.role == "tool"]
    assert all(m.startswith("Error: ") for m in tool_messages[:4]) and tool_messages[4] == "total=5"
    assert t.terminated and t.error is None and t.total_reward == 1.0
    assert result.metrics["failures"] == {"tool_bad_arguments": 2, "tool_raised": 1, "tool_unknown": 1}


async def test_capacity_below_concurrency_fails_at_start_naming_what_to_set(servers, renderer, scripted):
    env = OpenEnvEnvironment(servers.url["small"])  # max_concurrent_envs=2
    backend = scripted(add_until_five(renderer))
    samples = [Sample(prompt=prompt(i), task_name="c", row={"seed": i}) for i in range(6)]
    with pytest.raises(ConfigError) as error:
        await arollout(samples, {"c": env}, backend, renderer, RolloutConfig(concurrency=4))
    message = str(error.value)
    assert "max_concurrent_envs=4" in message and "SUPPORTS_CONCURRENT_SESSIONS" in message
    assert "max_sessions=2" in message and "concurrency to 2" in message
    assert backend.calls == 0  # nothing was generated
    # the probe released what it opened: a rollout that fits runs right after
    result = await arollout(samples, {"c": env}, backend, renderer, RolloutConfig(concurrency=2))
    assert all(t.terminated for t in result.trajectories)


async def test_check_env_passes_for_openenv_servers(servers):
    samples = [Sample(prompt=prompt(i), row={"seed": i}) for i in range(2)]
    # (not counter: its metadata counts live sessions, which check_env rightly calls non-deterministic)
    await acheck_env(OpenEnvEnvironment(servers.url["picture"]), samples=samples, steps=4)
    await acheck_env(OpenEnvEnvironment(servers.url["quiz"], text_field="answer"), samples=samples, steps=4)


async def test_images_in_observations(servers, renderer, scripted):
    env = OpenEnvEnvironment(servers.url["picture"])
    samples = [Sample(prompt=prompt(0), task_name="pic", row={"seed": 2})]
    text_only = scripted(add_until_five(renderer))
    with pytest.raises(ConfigError, match="may return images .*text-only"):
        await arollout(samples, {"pic": env}, text_only, renderer, RolloutConfig())
    assert text_only.calls == 0

    seen = []

    class Vision(type(text_only)):
        accepts_images = True

        async def generate(self, prompt_ids, params, images=()):
            seen.append(len(images))
            return await super().generate(prompt_ids, params)

    vision = Vision(add_until_five(renderer), renderer, end_token_id=renderer.stop_token_ids[0])
    result = await arollout(samples, {"pic": env}, vision, renderer, RolloutConfig())
    t = result.trajectories[0]
    assert t.terminated and t.total_reward == 1.0 and seen == [1, 2, 3]  # reset image, then one per step
    record = t.to_json()["messages"]
    images = [i for m in record for i in m.get("images", [])]
    assert [i["mime"] for i in images] == ["image/png"] * 4
    assert base64.b64decode(images[0]["base64"]).startswith(b"\x89PNG")


async def test_unreachable_server_is_an_error_at_start_naming_the_url(renderer, scripted):
    env = OpenEnvEnvironment("http://127.0.0.1:9", connect_timeout=0.5)  # the discard port: refused
    backend = scripted(lambda r: "hi")
    with pytest.raises(EnvironmentError_, match="127.0.0.1:9"):
        await arollout([Sample(prompt=prompt(0))], {"default": env}, backend, renderer, RolloutConfig())
    assert backend.calls == 0


def test_bad_construction_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="base_url"):
        OpenEnvEnvironment("localhost:8000")
    with pytest.raises(ConfigError, match="max_sessions"):
        OpenEnvEnvironment("http://127.0.0.1:1", max_sessions=0)


async def test_capacity_reached_mid_run_fails_that_episode_with_the_reason(servers):
    env = OpenEnvEnvironment(servers.url["small"])  # 2 sessions; no prepare(): nothing reserved
    sample = Sample(prompt=prompt(0), row={"seed": 1})
    sessions = [env.open(sample) for _ in range(3)]
    try:
        await sessions[0].reset(sample)
        await sessions[1].reset(sample)
        with pytest.raises(EnvironmentError_, match=r"CAPACITY_REACHED.*max_sessions=2.*max_concurrent_envs"):
            await sessions[2].reset(sample)
    finally:
        for session in sessions:
            await session.close()
    await sessions[2].reset(sample)  # the closed sessions freed their slots
    await sessions[2].close()
