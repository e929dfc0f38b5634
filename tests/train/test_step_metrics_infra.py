"""What infrastructure failures cost a step, in its metrics: counted, kept out of the reward statistics."""

from __future__ import annotations

import pytest
import torch

from rollforge.train.advantages import Advantages, compute_advantages
from rollforge.inputs.rewards import Rewards
from rollforge.train.step_metrics import RankStep, infra_metrics, merge_ranks, step_metrics
from rollforge.train.update import UpdateStats
from scored_episodes import episode

STATS = UpdateStats(
    loss=0.0,
    policy_loss=0.0,
    kl=0.0,
    clip_fraction=0.0,
    mean_ratio=1.0,
    grad_norm=0.0,
    micro_batches=1,
    tokens=4,
    policy_tokens=2,
)


def batch():
    """Two groups of 4: group 0 loses one episode to a dead backend (after 2 retries) and has a policy
    failure (template_error, reward 0 that counts); group 1 loses three (env_error, env_timeout, episode_timeout)."""
    trajectories = [
        episode(0, 1.0),
        episode(1, 0.0, "template_error"),
        episode(2, 0.0, "backend_error", retries=2),
        episode(3, 1.0),
        episode(4, 0.5, retries=1),
        episode(5, 0.0, "env_error", retries=2),
        episode(6, 0.0, "env_timeout", retries=2),
        episode(7, 0.0, "episode_timeout", retries=2),
    ]
    keep = [t.outcome != "infra_failure" for t in trajectories]
    totals = [t.total_reward for t in trajectories]
    return trajectories, Rewards(totals, {}, {}), compute_advantages(totals, 4, "grpo", keep=keep)


def test_outcomes_split_infrastructure_from_the_policy():
    trajectories, _, _ = batch()
    assert [t.outcome for t in trajectories] == [
        "completed",
        "policy_failure",
        "infra_failure",
        "completed",
        "completed",
        "infra_failure",
        "infra_failure",
        "infra_failure",
    ]


def test_infra_metrics_count_failures_retries_and_what_the_groups_lost():
    trajectories, _, advantages = batch()
    assert infra_metrics(trajectories, advantages) == {
        "infra/failed_episodes": 4,
        "infra/retries": 9,  # 2 + 1 + 2 + 2 + 2
        "infra/groups_shrunk": 1,  # group 0: 3 kept
        "infra/groups_lost": 1,  # group 1: 1 kept
        "infra/reward_lost": 0.5,  # 4 of 8 episodes have no reward
        "episodes/policy_failures": 1,
    }


def test_reward_statistics_leave_out_the_unknown_rewards():
    trajectories, rewards, advantages = batch()
    m = step_metrics(1, trajectories, rewards, advantages, STATS, {}, lr=1e-3, times={"rollout": 1.0})
    # known rewards: 1, 0 (policy failure counts), 1, 0.5 -> mean 0.625; population std
    # sqrt(((0.375)^2 * 2 + (0.625)^2 + (0.125)^2) / 4) = sqrt(0.6875 / 4) = 0.414578
    assert m["reward/mean"] == 0.625 and m["reward/env/t"] == 0.625
    assert m["reward/std"] == pytest.approx(0.414578, abs=1e-6)
    assert (m["reward/min"], m["reward/max"]) == (0.0, 1.0)
    assert m["infra/failed_episodes"] == 4 and m["episodes/policy_failures"] == 1
    everything_failed = [episode(i, 0.0, "backend_error") for i in range(2)]
    totals = [0.0, 0.0]
    m = step_metrics(
        1,
        everything_failed,
        Rewards(totals, {}, {}),
        compute_advantages(totals, 2, keep=[False, False]),
        STATS,
        {},
        lr=1e-3,
        times={"rollout": 1.0},
    )
    assert (m["reward/mean"], m["reward/std"], m["reward/min"], m["reward/env/t"]) == (None, None, None, None)
    assert (m["infra/reward_lost"], m["infra/groups_lost"]) == (1.0, 1)


def test_ranks_add_up_their_infrastructure_counts():
    trajectories, rewards, advantages = batch()
    first = RankStep(
        trajectories[:4],
        Rewards(rewards.totals[:4], {}, {}),
        compute_advantages(rewards.totals[:4], 4, keep=[True, True, False, True]),
        STATS,
        {"infra_retries": 2, "infra_failures": 1, "errors": {"backend_error": 1}},
        {"rollout": 1.0},
    )
    second = RankStep(
        trajectories[4:],
        Rewards(rewards.totals[4:], {}, {}),
        compute_advantages(rewards.totals[4:], 4, keep=[True, False, False, False]),
        STATS,
        {"infra_retries": 7, "infra_failures": 3, "errors": {"env_error": 1}},
        {"rollout": 2.0},
    )
    merged = merge_ranks([first, second])
    assert torch.equal(merged.advantages.values, advantages.values)
    counts = ("zero_variance_groups", "groups", "excluded", "shrunk_groups", "lost_groups")
    assert (
        [getattr(merged.advantages, c) for c in counts] == [getattr(advantages, c) for c in counts] == [0, 2, 4, 1, 1]
    )
    assert (merged.rollout["infra_retries"], merged.rollout["infra_failures"]) == (9, 4)
    assert infra_metrics(merged.trajectories, merged.advantages) == infra_metrics(trajectories, advantages)


def test_advantages_built_without_the_new_counts_still_merge():
    old = RankStep(["a"], Rewards([1.0], {}, {}), Advantages(torch.tensor([0.0]), 1, 1), STATS, {}, {"rollout": 1.0})
    merged = merge_ranks([old, old])
    assert (merged.advantages.excluded, merged.advantages.lost_groups, merged.advantages.groups) == (0, 0, 2)
