"""Environments in a pool of Ray actors, on the session's local Ray instance (loopback only)."""

from __future__ import annotations

import asyncio
import os

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.cluster.env_pool import RayEnvironmentPool
from rollforge.envs.factory import FactoryEnvironment
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.placement import HERE, Placement
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import HANG_SECONDS
from rollforge.types import Sample

from ray_envs import Broken, Counter, LeakyClose, Slow

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def scripted(renderer, script, **kwargs):
    return ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0], **kwargs)


def add_until_three(renderer):
    def script(request) -> str:
        if "total=3" in renderer.decode(request.prompt_ids[-40:]):
            return "Done: three."
        return '<tool_call>\n{"name": "add", "arguments": {"n": 1}}\n</tool_call>'

    return script


def samples(n: int, task: str = "count") -> list[Sample]:
    return [Sample(prompt=[{"role": "user", "content": f"Episode {i}."}], task_name=task) for i in range(n)]


def comparable(t):
    return (t.token_ids, t.loss_mask, t.logprobs, t.rewards, t.messages, t.terminated, t.error)


async def test_pool_gives_the_same_trajectories_as_local_and_spreads_episodes(ray_session, renderer):
    config = RolloutConfig(max_turns=6, concurrency=8)
    local = await arollout(
        samples(8),
        {"count": FactoryEnvironment(Counter)},
        scripted(renderer, add_until_three(renderer)),
        renderer,
        config,
    )
    pool = RayEnvironmentPool(FactoryEnvironment(Counter), actors=2, num_cpus=0)
    try:
        remote = await arollout(
            samples(8), {"count": pool}, scripted(renderer, add_until_three(renderer)), renderer, config
        )
    finally:
        pool.shutdown()
    assert [comparable(t) for t in remote.trajectories] == [comparable(t) for t in local.trajectories]
    assert [(t.total_reward, t.turns, t.error) for t in remote.trajectories] == [(1.0, 4, None)] * 8
    for t in remote.trajectories:
        assert token_fidelity_gap(t, renderer) is None
    # reward functions get the episode's environment object back, as it was on its actor
    handles = [t.environment for t in remote.trajectories]
    assert all(isinstance(h, Counter) and h.total == 3 for h in handles)
    pids = {h.pid for h in handles}
    assert len(pids) == 2 and os.getpid() not in pids  # least-loaded placement used both actors
    # each trajectory names the actor that held it and the node it runs on (this one-node instance)
    node = ray_session.get_runtime_context().get_node_id()
    assert [t.served_by.environment for t in remote.trajectories] == [
        Placement(f"env/{i % 2}", node, "127.0.0.1") for i in range(8)
    ]
    assert all(t.served_by.generation is None for t in remote.trajectories)  # generated here
    assert {t.served_by for t in local.trajectories} == {HERE}
    assert remote.metrics["episodes_by_node"] == {"environment": {node: 8}}


async def test_bundled_environment_on_actors_passes_the_same_checks(ray_session, renderer):
    spec = get_env_spec("guess_number")
    rows = spec.samples(6, 0)

    config = RolloutConfig(max_turns=4, concurrency=6, max_new_tokens=16)
    local = await arollout(rows, {spec.name: spec.build()}, scripted(renderer, lambda r: "10"), renderer, config)
    pool = RayEnvironmentPool(spec.build(), actors=2, num_cpus=0, name=spec.name)
    try:
        remote = await arollout(rows, {spec.name: pool}, scripted(renderer, lambda r: "10"), renderer, config)
    finally:
        pool.shutdown()
    assert [comparable(t) for t in remote.trajectories] == [comparable(t) for t in local.trajectories]
    assert all(t.error is None for t in remote.trajectories)


async def test_killing_an_actor_mid_episode_fails_only_its_episodes_and_it_is_replaced(ray_kill, renderer, tmp_path):
    pool = RayEnvironmentPool(FactoryEnvironment(Slow), actors=2, num_cpus=0, name="slow")
    victim = pool.actor(0)
    gate = tmp_path / "gate"  # every add waits for this file: no episode can finish before it exists
    first_turns = asyncio.Event()
    answer = add_until_three(renderer)

    def script(request):
        if request.call == 5:  # all six episodes have generated their first turn: each is mid-episode
            first_turns.set()
        return answer(request)

    async def kill_mid_episode():
        await asyncio.wait_for(first_turns.wait(), HANG_SECONDS)
        await ray_kill(victim)  # dead before the gate opens: no call of its episodes is served after
        gate.touch()  # the surviving actor's episodes go on

    gated = [Sample(prompt=s.prompt, task_name=s.task_name, row={"gate": str(gate)}) for s in samples(6)]
    config = RolloutConfig(max_turns=6, concurrency=6)
    killer = asyncio.create_task(kill_mid_episode())
    try:
        result = await asyncio.wait_for(
            arollout(gated, {"count": pool}, scripted(renderer, script), renderer, config), HANG_SECONDS
        )
        await killer
        assert gate.exists()
        failed = [t for t in result.trajectories if t.error is not None]
        passed = [t for t in result.trajectories if t.error is None]
        # placement alternates between the two actors: episodes 0, 2, 4 were on the victim
        assert [t.index for t in failed] == [0, 2, 4]
        for t in failed:
            assert t.error.kind == "env_error"
            assert "actor 0 of 'slow' died" in t.error.message and "ray.kill" in t.error.message
            assert sum(t.loss_mask) > 0  # what the policy generated before the death is kept
        assert all(t.total_reward == 1.0 for t in passed) and len(passed) == 3
        # the failed episodes name the actor that held them when it died, the others the survivor
        assert [t.served_by.environment.name for t in result.trajectories] == ["slow/0", "slow/1"] * 3
        assert pool.replacements == 1 and pool.actor(0) is not victim
        # the replacement serves new episodes
        again = await arollout(
            samples(4), {"count": pool}, scripted(renderer, add_until_three(renderer)), renderer, config
        )
        assert all(t.error is None and t.total_reward == 1.0 for t in again.trajectories)
    finally:
        pool.shutdown()


async def test_an_episode_starting_on_a_dead_actor_moves_to_the_replacement(ray_session, ray_kill, renderer):
    pool = RayEnvironmentPool(FactoryEnvironment(Counter), actors=1, num_cpus=0)
    try:
        await pool.prepare(1)
        await ray_kill(pool.actor(0))  # dead before any episode starts
        config = RolloutConfig(max_turns=6, concurrency=2)
        result = await arollout(
            samples(2), {"count": pool}, scripted(renderer, add_until_three(renderer)), renderer, config
        )
        assert all(t.error is None and t.total_reward == 1.0 for t in result.trajectories)
        assert pool.replacements == 1
        # served by the replacement, which says where it runs as its predecessor did
        node = ray_session.get_runtime_context().get_node_id()
        assert [t.served_by.environment for t in result.trajectories] == [Placement("env/0", node, "127.0.0.1")] * 2
    finally:
        pool.shutdown()


async def test_environment_errors_on_actors_fail_their_episode_like_local_ones(ray_session, renderer):
    pool = RayEnvironmentPool(FactoryEnvironment(Broken), actors=1, num_cpus=0)
    try:
        result = await arollout(
            samples(2), {"count": pool}, scripted(renderer, add_until_three(renderer)), renderer, RolloutConfig()
        )
    finally:
        pool.shutdown()
    assert all(t.error.kind == "env_error" and "no simulator licence" in t.error.message for t in result.trajectories)
    assert [t.served_by.environment.name for t in result.trajectories] == ["env/0"] * 2  # the actor that raised


async def test_a_failing_close_on_an_actor_is_a_recorded_failure_not_an_error(ray_session, renderer):
    pool = RayEnvironmentPool(FactoryEnvironment(LeakyClose), actors=1, num_cpus=0)
    try:
        result = await arollout(
            samples(2), {"count": pool}, scripted(renderer, add_until_three(renderer)), renderer, RolloutConfig()
        )
    finally:
        pool.shutdown()
    for t in result.trajectories:
        assert t.error is None and t.total_reward == 1.0
        assert [f.kind for f in t.failures] == ["env_error"] and "did not shut down" in t.failures[0].message


def test_bad_pool_settings_are_named(ray_session):
    with pytest.raises(ConfigError, match="actors=0"):
        RayEnvironmentPool(FactoryEnvironment(Counter), actors=0)
    with pytest.raises(ConfigError, match="memory_mb"):
        RayEnvironmentPool(FactoryEnvironment(Counter), memory_mb=-1)
