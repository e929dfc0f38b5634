"""Weight versions: completions stamped, updates between requests (in-flight), pinned evaluation,
stale tokens masked. Requests and episode steps hold on events the tests release; ``settle()``
lets every ready task reach its next wait. Nothing waits for a time."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import HANG_SECONDS
from rollforge.train.versions import VersionedBackend, fresh_masks
from rollforge.types import Message, Sample, Trajectory


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def scripted(renderer):
    return ScriptedBackend(lambda r: "ok", renderer, end_token_id=renderer.stop_token_ids[0])


class Held(ScriptedBackend):
    """Replies "ok"; its first request signals ``entered`` and runs until ``release`` is set."""

    def __init__(self, renderer):
        super().__init__(lambda r: "ok", renderer, end_token_id=renderer.stop_token_ids[0])
        self.entered, self.release, self.requests = asyncio.Event(), asyncio.Event(), 0

    async def generate(self, prompt_ids, params):
        self.requests += 1
        if self.requests == 1:
            self.entered.set()
            await self.release.wait()
        return await super().generate(prompt_ids, params)


async def settle() -> None:
    """Let every ready task run until it waits (a number of loop passes, not a time)."""
    for _ in range(20):
        await asyncio.sleep(0)


class ThreeTurns(Environment):
    """Three turns; with ``between`` and ``resume`` events, the first step signals ``between`` and
    waits for ``resume`` (the episode stands between its first and second turn)."""

    def __init__(self, between: asyncio.Event | None = None, resume: asyncio.Event | None = None):
        self.between, self.resume = between, resume

    class Session(BaseSession):
        def __init__(self, env):
            self.env, self.turn = env, 0

        async def reset(self, sample):
            return Reset(prompt=sample.prompt)

        async def step(self, conversation):
            self.turn += 1
            if self.turn == 1 and self.env.between is not None:
                self.env.between.set()
                await self.env.resume.wait()
            return Step(messages=(Message("user", f"turn {self.turn}"),), reward=0.0, terminated=self.turn == 3)

    def open(self, sample):
        return self.Session(self)


async def test_update_waits_for_running_requests_and_holds_new_ones(renderer):
    held = Held(renderer)
    versions = VersionedBackend(held)
    order = []

    async def push():  # the request that was running has finished by now
        order.append(("push", first.done(), second.done()))

    from rollforge.backends.base import SamplingParams

    params = SamplingParams(max_new_tokens=4)
    first = asyncio.create_task(versions.generate([1, 2], params))
    await asyncio.wait_for(held.entered.wait(), HANG_SECONDS)  # the first request is running
    update = asyncio.create_task(versions.advance(push))
    await settle()
    second = asyncio.create_task(versions.generate([1, 2], params))  # arrives while the update waits
    await settle()
    assert not update.done() and not second.done() and held.requests == 1  # draining, holding
    held.release.set()
    done_first = await asyncio.wait_for(first, HANG_SECONDS)
    assert await update == 1
    done_second = await second
    assert order == [("push", True, False)]
    assert done_first.version == 0  # generated before the push, on the old weights
    assert done_second.version == 1  # held back until the new weights were in
    assert versions.version == 1


async def test_running_episode_continues_under_new_weights(renderer):
    """An update between the turns of an episode: its later turns carry the new version."""
    versions = VersionedBackend(scripted(renderer))
    sample = Sample(prompt=({"role": "user", "content": "go"},), task_name="t")
    pushed = 0

    async def push():
        nonlocal pushed
        pushed += 1

    between, resume = asyncio.Event(), asyncio.Event()
    rollout = asyncio.create_task(
        arollout([sample], {"t": ThreeTurns(between, resume)}, versions, renderer, RolloutConfig(max_turns=3))
    )
    await asyncio.wait_for(between.wait(), HANG_SECONDS)  # after the first turn's request
    await asyncio.wait_for(versions.advance(push), HANG_SECONDS)
    resume.set()
    (trajectory,) = (await asyncio.wait_for(rollout, HANG_SECONDS)).trajectories
    assert pushed == 1 and trajectory.turns == 3 and trajectory.error is None
    assert len(trajectory.versions) == trajectory.generated_tokens
    turn_lengths = [len(trajectory.versions) // 3] * 3  # "ok" + end token each turn
    first_turn = trajectory.versions[: turn_lengths[0]]
    assert set(first_turn) == {0} and set(trajectory.versions[turn_lengths[0] :]) == {1}
    assert list(trajectory.versions) == sorted(trajectory.versions)  # never back in time
    assert Trajectory.from_json(trajectory.to_json()).versions == trajectory.versions


async def test_pinned_holds_updates_until_it_ends(renderer):
    versions = VersionedBackend(scripted(renderer))
    from rollforge.backends.base import SamplingParams

    async def push():
        return None

    async with versions.pinned() as version:
        update = asyncio.create_task(versions.advance(push))
        await settle()
        assert not update.done()  # the evaluation's weights stay
        completion = await versions.generate([1], SamplingParams(max_new_tokens=2))  # requests still run
        assert version == completion.version == 0
    assert await update == 1


async def test_an_update_cancelled_while_draining_releases_the_held_requests(renderer):
    """The pipeline cancels its push on shutdown or failure; requests must not wait forever."""
    from rollforge.backends.base import SamplingParams

    held = Held(renderer)
    versions = VersionedBackend(held)
    params = SamplingParams(max_new_tokens=4)
    first = asyncio.create_task(versions.generate([1, 2], params))
    await asyncio.wait_for(held.entered.wait(), HANG_SECONDS)  # the first request is running
    update = asyncio.create_task(versions.advance(lambda: asyncio.sleep(0)))
    await settle()  # the update waits for it
    assert not update.done()
    update.cancel()
    await asyncio.gather(update, return_exceptions=True)
    later = await asyncio.wait_for(versions.generate([1, 2], params), HANG_SECONDS)  # while the first still runs
    held.release.set()
    assert (await first).version == later.version == 0  # nothing was applied


def test_fresh_masks_removes_tokens_older_than_the_bound():
    # one trajectory, two segments: policy tokens (in order) of versions 3, 3 | 4, 5, 5
    def t(versions):
        return Trajectory(
            index=0,
            task_name="t",
            messages=(),
            token_ids=(1,) * 8,
            loss_mask=(0, 1, 1, 0, 0, 1, 1, 1),
            logprobs=(None, -1.0, -1.0, None, None, -1.0, -1.0, -1.0),
            prompt_length=1,
            rewards=(),
            total_reward=0.0,
            turns=0,
            versions=versions,
        )

    masks = [torch.tensor([0.0, 1, 1, 0]), torch.tensor([0.0, 1, 1, 1])]
    out, stale = fresh_masks(masks, [0, 0], [t((3, 3, 4, 5, 5))], oldest=4)
    assert stale == 2
    assert out[0].tolist() == [0, 0, 0, 0] and out[1].tolist() == [0, 1, 1, 1]
    assert masks[0].tolist() == [0, 1, 1, 0]  # the caller's masks are not changed
    kept, none = fresh_masks(masks, [0, 0], [t(())], oldest=4)  # no versions: nothing is known to be old
    assert none == 0 and [m.tolist() for m in kept] == [m.tolist() for m in masks]


def test_versions_must_match_policy_tokens():
    from rollforge.errors import InvariantError

    with pytest.raises(InvariantError, match="2 weight versions for 1 policy tokens"):
        Trajectory(
            index=0,
            task_name="t",
            messages=(),
            token_ids=(1, 2),
            loss_mask=(0, 1),
            logprobs=(None, -1.0),
            prompt_length=1,
            rewards=(),
            total_reward=0.0,
            turns=0,
            versions=(0, 0),
        )
