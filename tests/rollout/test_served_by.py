"""The engine writes where each episode was served (``Trajectory.served_by``): the environment
actor its session reports (``BaseSession.placement``; a session that does not subclass it reports
nothing) and the replica of its last completion (``Completion.served_by``), in both scheduling
modes; the rollout metrics count episodes by node. Fakes stand for the Ray actors."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from rollforge.backends.base import BackendWrapper
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.placement import HERE, Placement, ServedBy
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Message, Sample, Trajectory

NODES = ("node-a", "node-b")


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


class TwoTurns:
    """The ``EnvSession`` protocol without ``BaseSession``: observes once, ends on the second turn."""

    def __init__(self):
        self.turn = 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        messages = (Message("user", "Again."),) if self.turn < 2 else ()
        return Step(messages=messages, reward=1.0, terminated=self.turn == 2)

    async def finish(self):
        return 0.0

    async def close(self):
        return None

    metadata = handle = None


class OnActor(BaseSession, TwoTurns):
    """A session that an actor of ``node`` holds, as ``RemoteSession`` reports it."""

    def __init__(self, slot: int):
        super().__init__()
        self.slot = slot

    @property
    def placement(self):
        return Placement(f"fake/{self.slot}", NODES[self.slot], f"10.0.0.{self.slot}")


class Env(Environment):
    def __init__(self, session):
        self.session, self.opened = session, 0

    def open(self, sample):
        self.opened += 1
        return self.session(self.opened % 2) if self.session is OnActor else self.session()


class Replicas(BackendWrapper):
    """Stamps each completion as a Ray replica does: ``replica <k>`` on ``node-<k>``, where ``k``
    counts the requests, so an episode's turns are served by different replicas."""

    def __init__(self, inner):
        super().__init__(inner)
        self.requests = 0

    async def generate(self, prompt_ids, params, **kwargs):
        completion = await self.inner.generate(prompt_ids, params, **kwargs)
        self.requests += 1
        served = Placement(f"replica {self.requests}", f"node-{self.requests}", "10.0.1.1")
        return dataclasses.replace(completion, served_by=served)


async def run(renderer, env, backend=None, mode="async"):
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(2)]
    scripted = ScriptedBackend(lambda r: "ok", renderer, end_token_id=renderer.stop_token_ids[0])
    config = RolloutConfig(mode=mode, max_turns=3, concurrency=1)  # one at a time: requests in order
    return await arollout(samples, {"default": env}, backend(scripted) if backend else scripted, renderer, config)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_the_session_actor_and_the_last_completions_replica_are_on_the_trajectory(renderer, mode):
    result = await run(renderer, Env(OnActor), Replicas, mode)
    first, second = result.trajectories
    assert first.turns == second.turns == 2 and first.error is None and second.error is None
    # episode 0 opened first (slot 1), generated requests 1 and 2; episode 1 (slot 0) requests 3 and 4
    assert first.served_by == ServedBy(
        Placement("fake/1", "node-b", "10.0.0.1"), Placement("replica 2", "node-2", "10.0.1.1")
    )
    assert second.served_by == ServedBy(
        Placement("fake/0", "node-a", "10.0.0.0"), Placement("replica 4", "node-4", "10.0.1.1")
    )
    assert Trajectory.from_json(json.dumps(first.to_json())).served_by == first.served_by
    assert result.metrics["episodes_by_node"] == {
        "environment": {"node-a": 1, "node-b": 1},
        "generation": {"node-2": 1, "node-4": 1},
    }


async def test_episodes_served_here_say_nothing(renderer):
    result = await run(renderer, Env(TwoTurns))
    assert [t.served_by for t in result.trajectories] == [HERE, HERE]
    assert "episodes_by_node" not in result.metrics
    assert all("served_by" not in t.to_json() for t in result.trajectories)


async def test_a_session_outside_base_session_reports_no_actor_but_the_replica_is_kept(renderer):
    result = await run(renderer, Env(TwoTurns), Replicas)
    assert [t.served_by.environment for t in result.trajectories] == [None, None]
    assert [t.served_by.generation.name for t in result.trajectories] == ["replica 2", "replica 4"]
    assert result.metrics["episodes_by_node"] == {"generation": {"node-2": 1, "node-4": 1}}
