"""RouterBackend over scripted replicas, driven by the real engine: sticky episodes, least-loaded
placement, exact trajectories, weight sync all-or-refuse, and its inputs. No Ray."""

from __future__ import annotations

import asyncio
import gc
import re
from collections import Counter

import pytest
from transformers import AutoTokenizer

from rollforge.backends.base import CURRENT_EPISODE, Backend, BackendWrapper, SamplingParams, WeightSync
from rollforge.backends.router import RouterBackend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.errors import BackendError, ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import HANG_SECONDS
from rollforge.types import Message, Sample

MARKER = re.compile(r"Task number (\d+)\.")
PARAMS = SamplingParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


class Replica(ScriptedBackend):
    """Replies with its episode's number; records the episode number of every request it serves."""

    def __init__(self, renderer, latency=0.0):
        self.seen: list[int] = []
        self._renderer = renderer
        super().__init__(self._reply, renderer, end_token_id=renderer.stop_token_ids[0], latency=latency)

    def _reply(self, request) -> str:
        found = MARKER.search(self._renderer.decode(request.prompt_ids))
        episode = int(found.group(1)) if found else -1
        self.seen.append(episode)
        return f"Reply for {episode}."


class SyncingReplica(Replica):
    """A replica with weight sync; ``fail`` makes its next updates raise. Given ``hold``, an update
    sets ``updating`` and waits for ``hold`` before it applies."""

    def __init__(self, renderer, fail=False, hold: asyncio.Event | None = None):
        super().__init__(renderer, latency=0.01)
        self.fail, self.models, self.weight_version = fail, [], 0
        self.versions_served: list[int] = []
        self.hold, self.updating = hold, asyncio.Event()

    async def generate(self, prompt_ids, params):
        self.versions_served.append(self.weight_version)
        return await super().generate(prompt_ids, params)

    async def update_weights(self, model):
        self.updating.set()
        if self.hold is not None:
            await self.hold.wait()
        if self.fail:
            raise BackendError("disk full")
        self.models.append(model)
        self.weight_version += 1


class Session(BaseSession):
    """Three turns, each answered by a user observation."""

    def __init__(self):
        self.turn = 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        return Step(messages=(Message("user", f"observation {self.turn}"),), reward=0.5, terminated=self.turn == 3)


class Env(Environment):
    def open(self, sample):
        return Session()


def samples(n: int) -> list[Sample]:
    return [Sample(prompt=[{"role": "user", "content": f"Task number {i}."}]) for i in range(n)]


def comparable(t):
    return (t.token_ids, t.loss_mask, t.logprobs, t.rewards, t.messages, t.terminated, t.error)


async def rollout(backend, renderer, episodes, concurrency):
    config = RolloutConfig(max_turns=5, concurrency=concurrency)
    return (await arollout(samples(episodes), {"default": Env()}, backend, renderer, config)).trajectories


def owners(replicas) -> dict[int, int]:
    """Episode -> the one replica that served it (fails if an episode was served by two)."""
    owner: dict[int, int] = {}
    for k, replica in enumerate(replicas):
        for episode in set(replica.seen):
            assert episode not in owner, f"episode {episode} was served by replicas {owner[episode]} and {k}"
            owner[episode] = k
    return owner


async def test_every_turn_stays_on_one_replica_and_simultaneous_episodes_spread_evenly(renderer):
    replicas = [Replica(renderer, latency=0.02) for _ in range(3)]
    router = RouterBackend(replicas)
    assert isinstance(router, Backend)
    trajectories = await rollout(router, renderer, episodes=12, concurrency=12)
    assert [(t.error, t.turns) for t in trajectories] == [(None, 3)] * 12
    owner = owners(replicas)
    for t in trajectories:
        assert Counter(replicas[owner[t.index]].seen)[t.index] == t.turns
        assert token_fidelity_gap(t, renderer) is None
    assert router.episodes == [4, 4, 4] and router.requests == [12, 12, 12]
    assert router.in_flight == [0, 0, 0] and router.failures == [0, 0, 0]
    assert router.stats()["replica 1"] == {
        "requests": 12,
        "episodes": 4,
        "live_episodes": router.live_episodes[1],
        "in_flight": 0,
        "failures": 0,
    }
    await asyncio.sleep(0)  # the loop drops its handle of the finished gather, which holds the episode tasks
    gc.collect()
    assert router.live_episodes == [0, 0, 0]  # placements vanish with their episodes


class Held(Replica):
    """A replica whose requests wait until ``ready()`` says so: slower than the other replica by as
    much as the test wants, with no clock involved."""

    def __init__(self, renderer, ready):
        super().__init__(renderer)
        self.ready, self.release = ready, asyncio.Event()

    async def generate(self, prompt_ids, params):
        if self.ready():
            self.release.set()
        await self.release.wait()
        return await super().generate(prompt_ids, params)


async def test_a_slow_replica_gets_fewer_new_episodes(renderer):
    # The slow replica answers nothing until every episode placed elsewhere has finished. While it
    # holds two episodes' requests, the fast one has at most one in flight whenever an episode is
    # placed (4 at a time: two held, the new one, one other), so the slow one takes at most two.
    finished: list[int] = []

    def others_done() -> bool:
        return len(finished) + router.episodes[0] == 16

    def on_episode(t):
        finished.append(t.index)
        if others_done():
            slow.release.set()

    slow, fast = Held(renderer, others_done), Replica(renderer)
    router = RouterBackend([slow, fast])
    config = RolloutConfig(max_turns=5, concurrency=4)
    result = await asyncio.wait_for(
        arollout(samples(16), {"default": Env()}, router, renderer, config, on_episode=on_episode), HANG_SECONDS
    )
    assert all(t.error is None and t.turns == 3 for t in result.trajectories)
    owner = owners([slow, fast])
    assert sorted(finished) == list(range(16)) and sum(router.episodes) == 16
    assert 1 <= router.episodes[0] <= 2 and router.episodes[0] == list(owner.values()).count(0), router.episodes


async def test_trajectories_equal_a_single_backend_run(renderer):
    single = await rollout(Replica(renderer, latency=0.005), renderer, episodes=8, concurrency=8)
    routed = await rollout(
        RouterBackend([Replica(renderer, latency=0.005) for _ in range(2)]), renderer, episodes=8, concurrency=8
    )
    assert [comparable(t) for t in routed] == [comparable(t) for t in single]
    assert all(t.error is None for t in routed)


async def test_calls_outside_episodes_go_to_the_least_loaded_live_replica(renderer):
    replicas = [Replica(renderer, latency=0.02) for _ in range(3)]
    replicas[2].dead = "its actor was killed"
    router = RouterBackend(replicas)
    await asyncio.gather(*(router.generate([5, 6, 7], PARAMS) for _ in range(4)))
    assert router.requests == [2, 2, 0] and router.episodes == [0, 0, 0]


async def test_episode_objects_that_cannot_be_weakly_referenced_are_pinned_and_bounded(renderer):
    router = RouterBackend([Replica(renderer), Replica(renderer)], max_pinned=2)

    async def call(episode):
        CURRENT_EPISODE.set(episode)  # in this task only, as the engine does
        await router.generate([5, 6, 7], PARAMS)

    for episode in (1001, 1002, 1001, 1002, 1001):  # ints: no weak references
        await asyncio.create_task(call(episode))
    assert router.episodes == [1, 1] and router.requests == [3, 2]
    await asyncio.create_task(call(1003))  # placed on replica 0; evicts the least recently used (1002)
    assert router.episodes == [2, 1] and router.live_episodes == [2, 0]
    await asyncio.create_task(call(1002))  # forgotten: placed anew, where the fewest live episodes are
    assert router.episodes == [2, 2]


async def test_update_weights_reaches_every_replica_and_new_requests_wait_for_it(renderer):
    hold = asyncio.Event()
    replicas = [SyncingReplica(renderer, hold=hold), SyncingReplica(renderer, hold=hold)]
    router = RouterBackend(replicas)
    assert isinstance(router, WeightSync) and router.weight_version == 0
    model = object()
    update = asyncio.create_task(router.update_weights(model))
    await asyncio.wait_for(asyncio.gather(*(r.updating.wait() for r in replicas)), HANG_SECONDS)
    request = asyncio.create_task(router.generate([5, 6, 7], PARAMS))  # must wait for the update
    for _ in range(20):  # every pass of the loop the request could use to reach a replica
        await asyncio.sleep(0)
    assert not request.done() and [r.versions_served for r in replicas] == [[], []]
    hold.set()
    await asyncio.wait_for(asyncio.gather(update, request), HANG_SECONDS)
    assert [r.models for r in replicas] == [[model], [model]] and router.weight_version == 1
    assert replicas[0].versions_served == [1] and replicas[1].versions_served == []


async def test_a_failed_update_names_the_replica_and_refuses_mixed_weights(renderer):
    good, bad = SyncingReplica(renderer), SyncingReplica(renderer, fail=True)
    router = RouterBackend([good, bad], names=["east", "west"])
    with pytest.raises(BackendError, match=r"updating the weights failed on west \(BackendError: disk full\)"):
        await router.update_weights(object())
    assert router.weight_version == 0 and good.weight_version == 1
    with pytest.raises(BackendError, match=r"may serve different weights.*west"):
        await router.generate([5, 6, 7], PARAMS)
    bad.fail = False
    await router.update_weights(object())  # a complete update lifts the refusal
    assert router.weight_version == 1
    await router.generate([5, 6, 7], PARAMS)


async def test_without_sync_on_every_replica_the_router_has_none(renderer):
    syncing = SyncingReplica(renderer)
    router = RouterBackend([syncing, Replica(renderer)], names=["east", "west"])
    assert not router.syncs_weights and not hasattr(router, "weight_version")
    assert not isinstance(router, WeightSync)
    with pytest.raises(BackendError, match=r"^west of this router have no weight sync"):
        await router.update_weights(object())
    assert syncing.models == []  # refused before any replica was touched


class SharingReplica(SyncingReplica):
    """A replica class whose ``share_weights`` prepares the model once for all its replicas."""

    shared: list[object] = []

    @staticmethod
    def share_weights(model):
        SharingReplica.shared.append(model)
        return ("exported", model)


async def test_each_distinct_share_weights_runs_once_and_feeds_its_replicas(renderer):
    SharingReplica.shared = []
    sharing = [SharingReplica(renderer), BackendWrapper(SharingReplica(renderer))]  # a wrapper forwards it
    plain = SyncingReplica(renderer)  # Backend's default: the model itself
    router = RouterBackend([*sharing, plain])
    model = object()
    await router.update_weights(model)
    assert SharingReplica.shared == [model]
    assert sharing[0].models == sharing[1].inner.models == [("exported", model)] and plain.models == [model]


async def test_wrapped_replicas_keep_their_name_and_death(renderer):
    inner = [Replica(renderer), Replica(renderer)]
    inner[0].name, inner[1].name, inner[0].dead = "east", "west", "its actor was killed"
    router = RouterBackend([BackendWrapper(r) for r in inner])
    assert router.names == ("east", "west")
    await router.generate([5, 6, 7], PARAMS)
    assert router.stats()["west"]["requests"] == 1 and router.requests == [0, 1]


def test_images_only_when_every_replica_accepts_them(renderer):
    class Vision(Replica):
        accepts_images = True

    assert RouterBackend([Vision(renderer), Vision(renderer)]).accepts_images
    assert not RouterBackend([Vision(renderer), Replica(renderer)]).accepts_images


async def test_close_closes_every_replica_once(renderer):
    replicas = [Replica(renderer), Replica(renderer)]
    router = RouterBackend(replicas)
    await router.close()
    await router.close()
    for replica in replicas:
        with pytest.raises(BackendError, match="closed"):
            await replica.generate([5], PARAMS)
    with pytest.raises(BackendError, match="router backend is closed"):
        await router.generate([5], PARAMS)


def test_bad_replica_lists_are_config_errors(renderer):
    with pytest.raises(ConfigError, match="at least one replica, got an empty list"):
        RouterBackend([])
    with pytest.raises(ConfigError, match=r"replica 1 \(object\) is not a backend"):
        RouterBackend([Replica(renderer), object()])
    with pytest.raises(ConfigError, match="2 names for 1 replicas"):
        RouterBackend([Replica(renderer)], names=["a", "b"])
    with pytest.raises(ConfigError, match="a list of backends"):
        RouterBackend(r for r in [Replica(renderer)])
