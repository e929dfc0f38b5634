"""Dynamic sampling (DAPO): which groups have reward variance, how many prompts each round draws,
the bounded draw loop on scripted reward tables, and training runs on the tiny model whose reward
function makes chosen prompts' groups flat (counts worked by hand), and that repeat themselves."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from rollforge.errors import ConfigError
from rollforge.recipes.launch import train
from rollforge.train.config import load_config
from rollforge.inputs.rewards import RewardFunction, Rewards
from rollforge.train.sampling import Scored, fill, join, known, round_size, take, varied_groups
from scored_episodes import episode


# --- which groups have variance ------------------------------------------------------------------


def test_only_groups_whose_rewards_differ_are_varied():
    # groups of 4: [1,1,1,1] flat, [0,1,0,1] differs, [0,0,0,0] flat
    assert varied_groups([1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0], 4) == [False, True, False]
    # a single difference is enough, however small; negative rewards too
    assert varied_groups([0.5, 0.5, 0.5, 0.5001, -1, -1, -1, -1], 4) == [True, False]


def test_infrastructure_failures_do_not_count_towards_variance():
    # group 0: the only different reward (0) is a lost episode -> its known rewards 1,1,1 are flat
    # group 1: known 0, 0, 1 (the failure's 0 is not a reward) -> varied
    # group 2: one known member -> no baseline, dropped like a flat group
    # group 3: every member lost -> dropped
    totals = [1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    keep = [True, False, True, True, True, True, True, False, True, False, False, False] + [False] * 4
    assert varied_groups(totals, 4, keep) == [False, True, False, False]


def test_unavailable_rewards_do_not_count_towards_variance_and_move_with_their_episodes():
    trajectories = tuple(episode(i, r) for i, r in enumerate([1, 0, 1, 1, 0, 1, 0, 1]))
    rewards = Rewards([1, 0, 1, 1, 0, 1, 0, 1], {}, {}, {1: "judge timed out"})  # episode 1's 0 is no reward
    assert known(trajectories, rewards) == [True, False] + [True] * 6
    assert varied_groups(rewards.totals, 4, known(trajectories, rewards)) == [False, True]
    scored = Scored(trajectories, rewards, {}, {})
    assert take(scored, [1, 0], 4).rewards.unavailable == {5: "judge timed out"}  # group 0 now second
    assert join([scored, scored]).rewards.unavailable == {1: "judge timed out", 9: "judge timed out"}


def test_round_sizes_follow_the_keep_rate_up_to_a_batch():
    assert round_size(8, 0, 0, 8) == 8  # the first round: a whole batch
    assert round_size(8, 8, 0, 8) == 8  # nothing kept yet: a whole batch again
    assert round_size(6, 8, 2, 8) == 8  # ceil(6 * 8 / 2) = 24, capped at the batch
    assert round_size(2, 8, 6, 8) == 3  # ceil(2 * 8 / 6) = ceil(2.67)
    assert round_size(1, 12, 7, 8) == 2  # ceil(12 / 7) = ceil(1.71)
    assert round_size(2, 4, 2, 4) == 4  # ceil(2 * 4 / 2)


# --- the bounded draw loop on scripted tables ------------------------------------------------------


class Table:
    """Prompts 0, 1, 2, ... drawn in order; prompt p's group earns ``rewards[p]`` (member j the
    j-th value); records each roll's (first episode index, episodes)."""

    def __init__(self, rewards: list[list[float]], group_size: int = 4):
        self.rewards, self.group_size, self.cursor, self.rolls = rewards, group_size, 0, []

    def draw(self, prompts: int) -> list[int]:
        drawn = range(self.cursor, self.cursor + prompts)
        self.cursor += prompts
        return [p for p in drawn for _ in range(self.group_size)]

    async def roll(self, samples: list[int], first: int) -> Scored:
        self.rolls.append((first, len(samples)))
        totals = [self.rewards[p][j % self.group_size] for j, p in enumerate(samples)]
        trajectories = tuple(episode(first + j, r) for j, r in enumerate(totals))
        rollout = {"wall_seconds": 1.0, "on_episode_errors": 0}
        return Scored(trajectories, Rewards(totals, {"f": list(totals)}, {}), rollout, {"rollout": 1.0, "score": 0.5})

    def fill(self, batch_size: int, max_rounds: int):
        return asyncio.run(
            fill(self.draw, self.roll, batch_size=batch_size, group_size=self.group_size, max_rounds=max_rounds)
        )


FLAT, VARIED = [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]


def test_more_prompts_are_drawn_until_the_batch_is_full_and_the_surplus_is_discarded():
    # batch 4. round 1: prompts 0-3 -> varied 1, 2 (2 kept); round 2: ceil(2 * 4 / 2) = 4 prompts,
    # 4-7 -> varied 4, 5, 7: two fill the batch, prompt 7 is surplus
    table = Table([FLAT, VARIED, VARIED, FLAT, VARIED, VARIED, FLAT, VARIED])
    scored, stats = table.fill(batch_size=4, max_rounds=4)
    assert table.rolls == [(0, 16), (16, 16)]  # episode indices continue: every episode its own seeds
    assert (stats.rounds, stats.groups_drawn, stats.groups_dropped, stats.groups_kept, stats.groups_surplus) == (
        2,
        8,
        3,
        4,
        1,
    )
    assert stats.metrics(4)["sampling/short"] == 0
    # the trained groups, in the order drawn: prompts 1, 2, 4, 5 = episodes 4-7, 8-11, 16-19, 20-23
    assert [t.index for t in scored.trajectories] == [*range(4, 12), *range(16, 24)]
    assert scored.rewards.totals == VARIED * 4 and scored.rewards.per_function["f"] == VARIED * 4
    # rollout metrics and times cover both rounds: 32 episodes, 2 x 1 s of wall time
    assert scored.rollout["episodes"] == 32 and scored.rollout["wall_seconds"] == 2.0
    assert scored.times == {"rollout": 2.0, "score": 1.0}


def test_a_full_first_round_draws_nothing_more():
    table = Table([VARIED] * 3)
    scored, stats = table.fill(batch_size=3, max_rounds=4)
    assert table.rolls == [(0, 12)] and (stats.rounds, stats.groups_dropped, stats.groups_kept) == (1, 0, 3)
    assert [t.index for t in scored.trajectories] == list(range(12))


def test_the_bound_trains_on_what_was_kept():
    # batch 4, at most 2 rounds: round 1 (prompts 0-3) keeps prompt 2; round 2 draws ceil(3 * 4 / 1)
    # = 12, capped at 4 prompts (4-7), and keeps prompt 6; the step trains on 2 groups, 2 short
    table = Table([FLAT, FLAT, VARIED, FLAT, FLAT, FLAT, VARIED, FLAT, VARIED])
    scored, stats = table.fill(batch_size=4, max_rounds=2)
    assert table.cursor == 8  # prompt 8 is never drawn
    assert (stats.rounds, stats.groups_drawn, stats.groups_dropped, stats.groups_kept, stats.groups_surplus) == (
        2,
        8,
        6,
        2,
        0,
    )
    assert stats.metrics(4)["sampling/short"] == 2
    assert [t.index for t in scored.trajectories] == [*range(8, 12), *range(24, 28)]


def test_a_step_that_keeps_nothing_trains_on_its_first_round():
    scored, stats = Table([FLAT] * 12).fill(batch_size=4, max_rounds=3)
    assert (stats.rounds, stats.groups_drawn, stats.groups_dropped, stats.groups_kept) == (3, 12, 12, 0)
    assert stats.metrics(4)["sampling/short"] == 4
    # what a step without dynamic sampling would train on: prompts 0-3, every group flat
    assert [t.index for t in scored.trajectories] == list(range(16)) and scored.rewards.totals == FLAT * 4
    assert scored.rollout["episodes"] == 48


def test_take_and_join_keep_rewards_with_their_episodes():
    a = asyncio.run(Table([FLAT, VARIED]).roll([0] * 4 + [1] * 4, 0))
    b = asyncio.run(Table([VARIED, FLAT]).roll([0] * 4 + [1] * 4, 8))
    whole = join([a, b])
    assert [t.index for t in whole.trajectories] == list(range(16))
    picked = take(whole, [3, 1], 4)  # b's flat group, then a's varied one
    assert [t.index for t in picked.trajectories] == [12, 13, 14, 15, 4, 5, 6, 7]
    assert picked.rewards.totals == FLAT + VARIED == [t.total_reward for t in picked.trajectories]


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, bad",
    [
        (["algorithm.dynamic_sampling=true", "algorithm.max_staleness=1"], "max_staleness=1"),
        (["algorithm.dynamic_sampling=true", "executor=ray", "ray.training_workers=2"], "ray.training_workers=2"),
        (["algorithm.dynamic_sampling_max_rounds=2"], "dynamic_sampling_max_rounds=2"),
    ],
)
def test_unsupported_combinations_are_one_line_refusals(overrides, bad):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=overrides)
    assert bad in str(caught.value) and "\n" not in str(caught.value)


# --- training on the tiny model ----------------------------------------------------------------------


def every_third_prompt_flat(prompts, completions, trajectories, id, **columns):
    """Prompts whose id is a multiple of 3 earn 0 in every episode (a flat group); the others
    alternate 0 and 1 by episode index (a group of consecutive indices always differs)."""
    return [0.0 if i % 3 == 0 else float(t.index % 2) for i, t in zip(id, trajectories)]


def never_differs(prompts, completions, **columns):
    return [1.0] * len(prompts)


def _records(out, step):
    return [json.loads(line) for line in (out / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()]


def _prompt_id(record):
    user = next(m["content"] for m in record["messages"] if m["role"] == "user")
    return int(user.rsplit("(", 1)[1].rstrip(")"))


def test_training_drops_flat_groups_and_draws_more_prompts(tiny_config):
    config = tiny_config(
        "steps=2", "data.shuffle=false", "algorithm.dynamic_sampling=true", "algorithm.env_reward_weight=0"
    )  # batch 4, groups of 8
    result = train(config, reward_functions=[RewardFunction("flat_thirds", every_third_prompt_flat)], console=False)
    counts = [
        {k.removeprefix("sampling/"): v for k, v in m.items() if k.startswith("sampling/")} for m in result.history
    ]
    # step 1: prompts 0-3 -> 1, 2 varied; ceil(2 * 4 / 2) = 4 more, 4-7 -> 4, 5, 7 varied (7 surplus)
    # step 2: prompts 8-11 -> 8, 10, 11 varied; ceil(1 * 4 / 3) = 2 more, 12-13 -> 13 varied
    assert counts == [
        {"rounds": 2, "groups_drawn": 8, "groups_dropped": 3, "groups_kept": 4, "groups_surplus": 1, "short": 0},
        {"rounds": 2, "groups_drawn": 6, "groups_dropped": 2, "groups_kept": 4, "groups_surplus": 0, "short": 0},
    ]
    lines = [json.loads(line) for line in (result.out / "metrics.jsonl").read_text().splitlines()]
    assert [line["sampling/groups_dropped"] for line in lines] == [3, 2]
    assert [m["rollout/episodes"] for m in result.history] == [64, 48]  # every episode generated
    assert [m["advantage/groups"] for m in result.history] == [4, 4]  # the trained ones
    assert [m["advantage/zero_variance_groups"] for m in result.history] == [0, 0]
    for step, prompts, first_indices in ((1, [1, 2, 4, 5], [8, 16, 32, 40]), (2, [8, 10, 11, 13], [0, 16, 24, 40])):
        records = _records(result.out, step)
        groups = [records[g : g + 8] for g in range(0, 32, 8)]
        assert [_prompt_id(g[0]) for g in groups] == prompts
        assert [g[0]["index"] for g in groups] == first_indices  # a later round's episodes have their own indices
        for group in groups:
            assert len({r["reward"] for r in group}) > 1 and any(r["advantage"] != 0 for r in group)
    state = json.loads((result.out / "checkpoints" / "step-000002" / "state.json").read_text())
    assert state["data"]["cursor"] == 14  # resumes after every prompt drawn: 8 + 6


def test_a_step_that_keeps_no_group_takes_no_optimizer_step(tiny_config):
    config = tiny_config(
        "steps=1",
        "algorithm.dynamic_sampling=true",
        "algorithm.dynamic_sampling_max_rounds=2",
        "algorithm.env_reward_weight=0",
    )
    result = train(config, reward_functions=[RewardFunction("same", never_differs)], console=False)
    metrics = result.history[0]
    assert (metrics["sampling/rounds"], metrics["sampling/groups_drawn"], metrics["sampling/groups_kept"]) == (2, 8, 0)
    assert metrics["sampling/short"] == 4 and metrics["rollout/episodes"] == 64
    # the first round's 4 flat groups: no advantage, nothing forwarded, no optimizer step
    assert (metrics["advantage/groups"], metrics["advantage/zero_variance_groups"]) == (4, 4)
    assert metrics["micro_batches"] == 0 and metrics["trained_tokens"] == 0 and metrics["reward/mean"] == 1.0
    assert [r["index"] for r in _records(result.out, 1)] == list(range(32))
    assert all(not isinstance(v, float) or math.isfinite(v) for v in metrics.values())


def test_the_same_seed_repeats_the_run(tiny_config, tmp_path):
    def run(name):
        config = tiny_config("steps=3", f"out={tmp_path / name}", "algorithm.dynamic_sampling=true", "eval_episodes=8")
        return train(config, console=False)

    first, second = run("first"), run("second")
    keys = (
        "reward/mean",
        "sampling/rounds",
        "sampling/groups_drawn",
        "sampling/groups_dropped",
        "sampling/groups_kept",
    )
    assert [[m[k] for k in keys] for m in first.history] == [[m[k] for k in keys] for m in second.history]
    # the update's numbers only up to float noise: the HF backend's logprobs depend (in the last
    # bits) on which requests shared a batch, and that follows the threads' timing
    assert [m["grad_norm"] for m in first.history] == pytest.approx([m["grad_norm"] for m in second.history], rel=1e-4)
    rewards = [[r["reward"] for r in _records(first.out, s)] for s in (1, 2, 3)]
    assert rewards == [[r["reward"] for r in _records(second.out, s)] for s in (1, 2, 3)]
    assert first.evaluations == second.evaluations and set(first.evaluations) == {"before", "after"}


def test_a_resumed_run_repeats_the_uninterrupted_one(tiny_config, tmp_path):
    def steps(result):
        return [
            (
                [_prompt_id(r) for r in _records(result.out, s)[::8]],
                [r["reward"] for r in _records(result.out, s)],
                result.history[s - 1]["sampling/groups_drawn"],
            )
            for s in (1, 2, 3, 4)
        ]

    on = ("algorithm.dynamic_sampling=true", "algorithm.dynamic_sampling_max_rounds=3")
    whole = train(tiny_config("steps=4", f"out={tmp_path / 'whole'}", *on), console=False)
    train(tiny_config("steps=2", "checkpoint_every=1", *on), console=False)
    resumed = train(tiny_config("steps=4", "checkpoint_every=1", *on), resume=True, console=False)
    assert steps(resumed) == steps(whole)
    assert sum(m["sampling/groups_drawn"] for m in whole.history) > 16  # later rounds drew prompts
    state = json.loads((resumed.out / "checkpoints" / "step-000004" / "state.json").read_text())
    assert state["data"]["cursor"] == sum(m["sampling/groups_drawn"] for m in whole.history)
