"""How an episode ends: an environment that truncates (``Step.truncated``, a limit outside the task)
ends the episode as ``truncated``, not ``terminated``; the trajectory's one ``ending`` field says
which, in both scheduling modes, and the rollout metrics count it."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Message, Sample, Trajectory


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


class Limited(BaseSession):
    """Answers each turn with an observation; on turn 2 ends the episode with ``flags`` (its own time
    limit: ``truncated``; a solved task: ``terminated``), saying ``last`` (empty: nothing)."""

    def __init__(self, flags, last):
        self.flags, self.last, self.turn = flags, last, 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        if self.turn < 2:
            return Step(messages=(Message("user", "Go on."),), reward=0.5)
        messages = (Message("user", self.last),) if self.last else ()
        return Step(messages=messages, reward=0.25, **self.flags)


class Env(Environment):
    def __init__(self, flags, last="Time is up."):
        self.flags, self.last = flags, last

    def open(self, sample):
        return Limited(self.flags, self.last)


async def run(renderer, env, mode="async", episodes=1):
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(episodes)]
    backend = ScriptedBackend(lambda r: "ok", renderer, end_token_id=renderer.stop_token_ids[0])
    return await arollout(samples, {"default": env}, backend, renderer, RolloutConfig(mode=mode, max_turns=5))


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_an_environment_that_truncates_ends_the_episode_truncated(renderer, mode):
    result = await run(renderer, Env({"truncated": True}), mode, episodes=2)
    for t in result.trajectories:
        assert t.ending == "truncated" and t.truncated and not t.terminated and not t.max_turns_reached
        assert t.turns == 2 and t.rewards == (0.5, 0.25) and t.error is None and t.outcome == "completed"
        assert t.messages[-1] == Message("user", "Time is up.")  # the last observation is kept, as on termination
        assert token_fidelity_gap(t, renderer) is None
        assert Trajectory.from_json(t.to_json()).ending == "truncated"
    m = result.metrics
    assert (m["truncation_rate"], m["natural_termination_rate"], m["max_turns_reached_rate"]) == (1.0, 0.0, 0.0)


async def test_truncated_without_an_observation_ends_on_the_policys_tokens(renderer):
    t = (await run(renderer, Env({"truncated": True}, last=""))).trajectories[0]
    assert t.ending == "truncated" and t.messages[-1].role == "assistant" and t.loss_mask[-1] == 1
    assert token_fidelity_gap(t, renderer) is None


async def test_a_step_that_says_both_ends_terminated_as_in_gymnasium(renderer):
    assert Step(terminated=True, truncated=True).ending == "terminated"
    assert Step(truncated=True).ending == "truncated" and Step().ending is None
    t = (await run(renderer, Env({"terminated": True, "truncated": True}))).trajectories[0]
    assert t.ending == "terminated" and t.turns == 2
