"""Reward functions: signature, weights, None for 'does not apply', async, and failures."""

import asyncio

import pytest

from rollforge.errors import ConfigError
from rollforge.train.config import RewardConfig
from rollforge.train.rewards import RewardFunction, compute_rewards, load_reward_functions, mean_or_none
from rollforge.types import Message, Sample, Trajectory


def _trajectory(index, task, reply, reward):
    return Trajectory(
        index=index, task_name=task,
        messages=(Message("user", "q"), Message("assistant", reply)),
        token_ids=(1, 2), loss_mask=(0, 1), logprobs=(None, -0.5), prompt_length=1,
        rewards=(reward,), total_reward=reward, turns=1, terminated=True,
    )


SAMPLES = [Sample((Message("user", "q"),), "math", {"answer": "4"}), Sample((Message("user", "q"),), "game", {"answer": None})]
TRAJECTORIES = [_trajectory(0, "math", "4", 0.5), _trajectory(1, "game", "left", 1.0)]


def exact(prompts, completions, environments=None, answer=None, task_name=None, **_):
    return [float(c[-1]["content"] == a) if t == "math" else None for c, a, t in zip(completions, answer, task_name)]


async def length_penalty(prompts, completions, **_):
    await asyncio.sleep(0)
    return [-0.1 * len(c[-1]["content"]) for c in completions]


async def test_weighted_functions_add_to_the_environment_reward():
    functions = [RewardFunction("exact", exact, 2.0), RewardFunction("length", length_penalty, 1.0)]
    r = await compute_rewards(TRAJECTORIES, SAMPLES, functions, env_weight=0.5)
    # math: 0.5 * 0.5 + 2 * 1.0 - 0.1 * 1 = 2.15 ; game: 0.5 * 1.0 + (exact: None) - 0.1 * 4 = 0.1
    assert r.totals == pytest.approx([2.15, 0.1])
    assert r.per_function["exact"] == [1.0, None]
    assert mean_or_none(r.per_function["exact"]) == 1.0


async def test_a_function_that_never_applies_has_a_missing_mean_not_nan():
    r = await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("none", lambda p, c, **_: [None, None])])
    assert mean_or_none(r.per_function["none"]) is None
    assert r.totals == [0.5, 1.0]


async def test_a_raising_function_costs_its_signal_not_the_run():
    def broken(prompts, completions, **_):
        raise RuntimeError("verifier crashed")

    r = await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("broken", broken)])
    assert r.per_function["broken"] == [None, None]
    assert "verifier crashed" in r.errors["broken"]
    assert r.totals == [0.5, 1.0]


async def test_wrong_shapes_and_values_are_named():
    with pytest.raises(ConfigError, match="returned 1 values; expected a list of 2"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("short", lambda p, c, **_: [1.0])])
    with pytest.raises(ConfigError, match="returned NaN"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("nan", lambda p, c, **_: [float("nan"), 1])])
    with pytest.raises(ConfigError, match="returned 'x'"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("text", lambda p, c, **_: ["x", 1])])


def test_functions_load_from_modules_and_files(tmp_path):
    (tmp_path / "my_rewards.py").write_text("def shout(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    loaded = load_reward_functions([RewardConfig(function=f"{tmp_path / 'my_rewards.py'}:shout", weight=0.5)])
    assert loaded[0].name == "shout" and loaded[0].weight == 0.5 and loaded[0].function([1], [2]) == [1.0]
    assert load_reward_functions([RewardConfig(function="rollforge.train.rewards:mean_or_none")])[0].function([None]) is None
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_reward_functions([RewardConfig(function="rollforge.train.rewards:nope")])
    with pytest.raises(ConfigError, match="cannot import module"):
        load_reward_functions([RewardConfig(function="no_such_module_xyz:f")])
