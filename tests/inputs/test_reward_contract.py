"""What reward functions are handed: the episodes whose reward can be known, never an
infrastructure failure (a failed ``reset`` leaves no environment object), so TRL-style functions
that read ``env.attribute`` run on a batch that mixes such an episode with good ones."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.factory import FactoryEnvironment
from rollforge.inputs.rewards import compute_rewards, unscored
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample


class Wordle:
    """As TRL's Wordle example keeps its state: ``reset`` raises for the row that asks it to (its
    server was down), so that episode has no environment object."""

    def reset(self, broken: bool = False, **row) -> str:
        if broken:
            raise ConnectionError("the game server is down")
        self.active, self.reward = False, 0.75
        return "Guess the word."

    def guess(self, word: str) -> str:
        """Guess a word.

        Args:
            word: Five letters.
        """
        return "G____"


def wordle_reward(environments, **kwargs) -> list[float]:
    """TRL's ``wordle_reward`` shape: reads an attribute of every environment it is handed."""
    seen.append(len(environments))
    return [0.0 if env.active else env.reward for env in environments]


seen: list[int] = []


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


async def test_reward_functions_are_never_handed_an_infrastructure_failure(renderer):
    seen.clear()
    rows = [{"broken": False}, {"broken": True}, {"broken": False}]
    batch = [Sample(prompt=[{"role": "user", "content": f"Game {i}."}], row=row) for i, row in enumerate(rows)]
    backend = ScriptedBackend(lambda r: "CRANE", renderer, end_token_id=renderer.stop_token_ids[0])
    env = FactoryEnvironment(Wordle)
    result = await asyncio.wait_for(arollout(batch, {"default": env}, backend, renderer, RolloutConfig()), 30)
    broken = result.trajectories[1]
    assert broken.outcome == "infra_failure" and broken.environment is None and broken.error.kind == "env_error"

    rewards = await compute_rewards(result.trajectories, batch, [wordle_reward])
    assert seen == [2]  # one call, with the two good episodes only
    assert rewards.errors == {}  # the function ran: env.active on None would have raised
    assert rewards.per_function == {"wordle_reward": [0.75, None, 0.75]}
    assert rewards.totals[0] == rewards.totals[2] == 0.75


async def test_a_batch_of_only_infrastructure_failures_calls_no_function(renderer):
    seen.clear()
    batch = [Sample(prompt=[{"role": "user", "content": "Game."}], row={"broken": True})]
    backend = ScriptedBackend(lambda r: "CRANE", renderer, end_token_id=renderer.stop_token_ids[0])
    result = await arollout(batch, {"default": FactoryEnvironment(Wordle)}, backend, renderer, RolloutConfig())
    rewards = await compute_rewards(result.trajectories, batch, [wordle_reward])
    assert seen == [] and rewards.per_function == {"wordle_reward": [None]} and rewards.errors == {}


class Scored(Wordle):
    def get_reward(self) -> float:
        return self.reward


def test_nothing_scores_classes_without_get_reward_and_no_function():
    flag = "--reward module.py:function"
    envs = {
        "a": FactoryEnvironment(Wordle),
        "b": FactoryEnvironment({"x": Wordle, "y": Wordle}),
        "c": FactoryEnvironment(Scored),
    }
    assert unscored(envs, ["a", "b", "a"], [], flag) == (
        "the environment class Wordle has no get_reward() and no reward function was given (--reward module.py:function)"
    )
    assert unscored(envs, ["a", "c"], [], flag) is None  # Scored gives its own reward
    assert unscored(envs, ["a"], [wordle_reward], flag) is None
    assert unscored({"f": FactoryEnvironment(lambda: Wordle())}, ["f"], [], flag) is None  # any class may come out
