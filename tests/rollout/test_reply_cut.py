"""A reply cut at ``max_new_tokens`` (the backend's ``finish_reason`` ``length``) after which the
environment ends the episode reads as truncated, not terminated, in the trajectory and in its JSON
record (what the viewer reads): a limit outside the task cut the reply the environment judged."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.fidelity import token_fidelity_gap
from rollforge.chat.render import ChatRenderer
from rollforge.endings import ending_of
from rollforge.envs.factory import FactoryEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample, Trajectory

REPLY = "The answer is forty two, and here is why it is so."


class Answerer:
    """A TRL-style class: a reply without a tool call ends the episode (terminated)."""

    def reset(self, **row) -> None:
        return None

    def get_reward(self) -> float:
        return 1.0


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


async def play(renderer, max_new_tokens: int) -> tuple[Trajectory, ScriptedBackend]:
    backend = ScriptedBackend(lambda r: REPLY, renderer, end_token_id=renderer.stop_token_ids[0])
    batch = [Sample(prompt=[{"role": "user", "content": "What is the answer?"}])]
    config = RolloutConfig(max_new_tokens=max_new_tokens)
    result = await asyncio.wait_for(
        arollout(batch, {"default": FactoryEnvironment(Answerer)}, backend, renderer, config), 30
    )
    return result.trajectories[0], backend


async def test_a_reply_cut_at_max_new_tokens_ends_the_episode_truncated(renderer):
    t, _ = await play(renderer, max_new_tokens=4)
    assert t.generated_tokens == 4 and t.turns == 1 and t.total_reward == 1.0
    assert t.truncated and not t.terminated and t.error is None
    record = t.to_json()
    assert record["truncated"] is True and record["terminated"] is False and ending_of(record) == "truncated"
    assert Trajectory.from_json(record).truncated
    assert token_fidelity_gap(t, renderer) is None


async def test_a_reply_that_ends_by_itself_terminates(renderer):
    t, _ = await play(renderer, max_new_tokens=64)
    assert t.generated_tokens == len(renderer.encode(REPLY)) + 1  # the reply and its end token
    assert t.terminated and not t.truncated
