"""Generation replicas on Ray actors behind a router, on the session's local Ray instance: two HF
replicas of the tiny model (num_cpus=0, so both fit on two CPUs) driven by the real engine.

The vLLM path (``open_generation(BackendConfig(kind="vllm", ..., replicas=N))``) builds the same actors with a vLLM engine
inside; it is not exercised here because each engine takes ~45 s to start on this machine.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from rollforge.backends.config import BackendConfig
from rollforge.backends.router import RouterBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.cluster.generation import open_generation
from rollforge.cluster.replicas import RayBackendReplica, start_replicas
from rollforge.backends.base import BackendWrapper
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.errors import BackendError, ConfigError
from rollforge.models import load_model
from rollforge.placement import Placement
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.train.logprobs import sequence_logprobs
from rollforge.types import Message, Sample

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def renderer(tiny):
    return ChatRenderer(tiny[1])


class Recording(BackendWrapper):
    """A replica as it is (its name, ``dead`` and ``share_weights`` forwarded by ``BackendWrapper``),
    plus the prompt of every request sent to it."""

    def __init__(self, inner):
        super().__init__(inner)
        self.prompts, self.completed = [], 0

    async def close(self):  # the router owns its replicas and closes them through this
        await self.inner.close()

    async def generate(self, prompt_ids, params):
        self.prompts.append(tuple(prompt_ids))
        completion = await self.inner.generate(prompt_ids, params)
        self.completed += 1
        return completion


class Hold:
    """Every episode's first step waits here until ``resume`` is set; ``all_waiting`` is set once
    all ``episodes`` have arrived (each generated once and none generates now)."""

    def __init__(self, episodes: int):
        self.episodes, self.arrived = episodes, 0
        self.all_waiting, self.resume = asyncio.Event(), asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        if self.arrived == self.episodes:
            self.all_waiting.set()
        await self.resume.wait()


class Session(BaseSession):
    def __init__(self, hold):
        self.hold, self.turn = hold, 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        if self.turn == 1 and self.hold is not None:
            await self.hold.wait()
        return Step(messages=(Message("user", f"observation {self.turn}"),), terminated=self.turn == 3)


class Env(Environment):
    def __init__(self, hold=None):
        self.hold = hold

    def open(self, sample):
        return Session(self.hold)


async def rollout(router, renderer, episodes=4, hold=None):
    samples = [Sample(prompt=[{"role": "user", "content": f"Task number {i}."}]) for i in range(episodes)]
    config = RolloutConfig(max_turns=3, concurrency=episodes, max_new_tokens=8, seed=3)
    return (await arollout(samples, {"default": Env(hold)}, router, renderer, config)).trajectories


def owner(trajectory, replicas) -> int:
    """The one replica that served every request of this episode."""
    served = [k for k, r in enumerate(replicas) if any(trajectory.token_ids[: len(p)] == p for p in r.prompts)]
    assert len(served) == 1, (trajectory.index, served)
    return served[0]


def teacher_forced(model, trajectory) -> tuple[torch.Tensor, torch.Tensor]:
    """(the trajectory's logprobs, ``model``'s teacher-forced logprobs) at its policy tokens."""
    ids = torch.tensor([trajectory.token_ids])
    targets = torch.tensor([trajectory.loss_mask], dtype=torch.bool)
    with torch.inference_mode():
        expected = sequence_logprobs(model, ids, torch.ones_like(ids), targets)[targets]
    return torch.tensor([lp for lp in trajectory.logprobs if lp is not None]), expected


async def test_hf_replicas_on_actors_are_exact_sticky_synced_and_fail_alone(
    ray_session, ray_kill, tiny_model_dir, tiny, renderer
):
    model = tiny[0]
    built = open_generation(BackendConfig(model=str(tiny_model_dir), replicas=2, replica_cpus=0, concurrency=8, seed=0))
    assert isinstance(built, RouterBackend) and all(isinstance(r, RayBackendReplica) for r in built.replicas)
    assert [(r.config.seed, r.config.replicas, r.config.replica_cpus) for r in built.replicas] == [(0, 1, 0), (1, 1, 0)]
    replicas = [Recording(r) for r in built.replicas]
    router = RouterBackend(replicas)
    try:
        trajectories = await rollout(router, renderer)
        for t in trajectories:
            assert t.error is None and t.turns == 3, (t.index, t.error)
            assert token_fidelity_gap(t, renderer) is None, token_fidelity_gap(t, renderer)
            got, expected = teacher_forced(model, t)
            assert (got - expected).abs().max().item() < 1e-4
            mine = replicas[owner(t, replicas)].prompts
            assert sum(t.token_ids[: len(p)] == p for p in mine) == t.turns  # every turn on that replica
            # the trajectory names that replica and its node (this one-node instance's)
            node = ray_session.get_runtime_context().get_node_id()
            assert t.served_by.generation == Placement(f"hf replica {owner(t, replicas)}", node, "127.0.0.1")
            assert t.served_by.environment is None  # the environment ran here
        assert all(n >= 1 for n in router.episodes), router.episodes

        changed = copy.deepcopy(model)
        torch.manual_seed(1)
        with torch.no_grad():
            for parameter in changed.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.05)
        await router.update_weights(changed)
        assert router.weight_version == 1 and [r.weight_version for r in built.replicas] == [1, 1]
        for t in await rollout(router, renderer):
            assert t.error is None
            got, expected = teacher_forced(changed, t)
            assert (got - expected).abs().max().item() < 1e-4
            _, before = teacher_forced(model, t)
            assert (got - before).abs().max().item() > 1e-3  # the replicas serve the new weights

        for r in replicas:
            r.prompts.clear()
            r.completed = 0
        victim = built.replicas[0]

        hold = Hold(4)

        async def kill_after_first_turns():
            await hold.all_waiting.wait()  # every episode generated once, now waits in its first step
            await ray_kill(victim.actor)  # dead before the episodes go on: none is served by it again
            hold.resume.set()

        killer = asyncio.create_task(kill_after_first_turns())
        trajectories = await rollout(router, renderer, hold=hold)
        await killer
        assert sum(r.completed for r in replicas) >= 4
        on_victim = {t.index for t in trajectories if owner(t, replicas) == 0}
        assert on_victim and len(on_victim) < 4
        for t in trajectories:
            if t.index in on_victim:
                assert t.error.kind == "backend_error" and "hf replica 0 died" in t.error.message, t.error
                assert t.turns == 1  # what was produced before the death is kept
                assert t.served_by.generation.name == "hf replica 0"  # its last completion's replica
            else:
                assert t.error is None and t.turns == 3
        assert victim.dead and "ray.kill" in victim.dead
        for r in replicas:
            r.prompts.clear()
        again = await rollout(router, renderer, episodes=2)  # new episodes avoid the dead replica
        assert all(t.error is None for t in again) and owner(again[0], replicas) == owner(again[1], replicas) == 1
    finally:
        await router.close()


def test_a_replica_that_cannot_start_is_named(ray_session, tmp_path):
    with pytest.raises(BackendError, match=r"hf replica 0 failed to start: .*ModelError: .*does not exist"):
        start_replicas(BackendConfig(model=str(tmp_path / "missing"), replica_cpus=0), start_timeout=120)
    with pytest.raises(ConfigError, match=r"a Ray replica runs one of hf, vllm, not 'openai'"):
        RayBackendReplica(BackendConfig(kind="openai", model=str(tmp_path), base_url="http://127.0.0.1:1"))
    with pytest.raises(ConfigError, match=r"hf_model cannot be shared by 2 replicas on Ray actors"):
        open_generation(BackendConfig(model=str(tmp_path), replicas=2), hf_model=object())
