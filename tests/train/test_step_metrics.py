"""Merging the ranks' shares of a step into the global batch's (rank 0 logs that)."""

from __future__ import annotations

import torch

from rollforge.train.advantages import Advantages
from rollforge.inputs.rewards import Rewards
from rollforge.train.step_metrics import RankStep, merge_ranks
from rollforge.train.update import UpdateStats


def _stats(loss, clip, ratio, tokens, policy_tokens) -> UpdateStats:
    return UpdateStats(
        loss=loss,
        policy_loss=loss,
        kl=0.0,
        clip_fraction=clip,
        mean_ratio=ratio,
        grad_norm=2.5,
        micro_batches=1,
        tokens=tokens,
        policy_tokens=policy_tokens,
    )


def test_two_ranks_merge_into_the_global_step():
    first = RankStep(
        ["a0", "a1"],
        Rewards([1.0, 0.0], {"fmt": [0.5, None]}, {}),
        Advantages(torch.tensor([1.0, -1.0]), 0, 1),
        _stats(0.25, 0.5, 1.0, 30, 10),
        {"episodes": 2, "errors": {"env_error": 1}, "failures": {}},
        {"rollout": 3.0, "update": 1.0, "sync": 0.1},
    )
    second = RankStep(
        ["b0", "b1"],
        Rewards([0.5, 0.5], {"fmt": [1.0, 0.0]}, {"fmt": "ValueError: x"}),
        Advantages(torch.tensor([0.0, 0.0]), 1, 1),
        _stats(-0.5, 0.0, 1.5, 50, 30),
        {"episodes": 2, "errors": {"env_error": 2, "backend_error": 1}, "failures": {"tool_unknown": 4}},
        {"rollout": 2.0, "update": 1.5, "sync": 0.2},
    )
    merged = merge_ranks([first, second])
    assert merged.trajectories == ["a0", "a1", "b0", "b1"]
    assert merged.rewards.totals == [1.0, 0.0, 0.5, 0.5]
    assert merged.rewards.per_function == {"fmt": [0.5, None, 1.0, 0.0]}
    assert merged.rewards.errors == {"fmt": "ValueError: x"}
    assert merged.advantages.values.tolist() == [1.0, -1.0, 0.0, 0.0]
    assert (merged.advantages.zero_variance_groups, merged.advantages.groups) == (1, 2)
    assert merged.rollout["errors"] == {"env_error": 3, "backend_error": 1}
    assert merged.rollout["failures"] == {"tool_unknown": 4}
    assert merged.times == {"rollout": 3.0, "update": 1.5, "sync": 0.2}  # the slowest rank's
    update = merged.update
    assert (update.loss, update.tokens, update.policy_tokens, update.grad_norm) == (-0.25, 80, 40, 2.5)
    assert update.clip_fraction == (0.5 * 10 + 0.0 * 30) / 40  # 5 clipped tokens of 40
    assert update.mean_ratio == (1.0 * 10 + 1.5 * 30) / 40


def test_one_rank_is_unchanged():
    only = RankStep(
        ["a"],
        Rewards([1.0], {}, {}),
        Advantages(torch.tensor([0.0]), 1, 1),
        _stats(0.0, 0.0, 1.0, 3, 1),
        {},
        {"rollout": 1.0},
    )
    assert merge_ranks([only]) is only
