"""The flat metrics dict of one training step (one line of ``metrics.jsonl``).

Keys: ``step``; ``reward/mean|std|min|max`` and ``reward/env/<task>`` (mean total per environment),
over the episodes whose reward is known (not infrastructure failures; None when there are none);
``reward/fn/<name>`` (mean of a reward function over the samples it applied to, None when it
applied to none) and ``reward/errors``; ``advantage/mean|abs_mean``, ``advantage/zero_variance_groups``
and ``advantage/groups``; ``infra/failed_episodes|retries|groups_shrunk|groups_lost|reward_lost`` and
``episodes/policy_failures`` (``infra_metrics``); the update's ``loss``, ``policy_loss``, ``kl``,
``clip_fraction``, ``mean_ratio``, ``grad_norm``, ``lr``; the off-policy correction's
``behaviour_weight_mean`` (mean factor it put on the policy tokens' losses: 1 without one) and
``off_policy_tokens`` (tokens whose behaviour weight it truncated or masked, see ``corrections``);
the engine/trainer mismatch, whatever the correction (``losses.mismatch``): ``mismatch/kl`` (mean
over policy tokens of the k3 estimate of KL(behaviour || trainer before the update)),
``mismatch/max_abs_log_ratio`` and ``mismatch/off_policy_share`` (off_policy_tokens / policy tokens);
token counts and ``tokens_per_second``; ``time/*`` (rollout = generation and environments, update,
sync, step); and the engine's rollout metrics under ``rollout/``. A mean over nothing is None, never NaN.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from ..types import Trajectory
from .advantages import Advantages
from ..inputs.rewards import Rewards, mean_or_none
from .update import UpdateStats


@dataclass(frozen=True)
class RankStep:
    """What one rank's step produced, as ``step_metrics`` takes it (rank 0 gathers every rank's)."""

    trajectories: Sequence[Trajectory]
    rewards: Rewards
    advantages: Advantages
    update: UpdateStats
    rollout: dict[str, Any]
    times: dict[str, float]


#: The counts of ``Advantages``: each rank counts its own groups, and they add up.
COUNTS = ("zero_variance_groups", "groups", "excluded", "shrunk_groups", "lost_groups")


def merge_ranks(parts: Sequence[RankStep]) -> RankStep:
    """The step of the global batch from every rank's share, in rank order: episodes, rewards and
    advantages concatenate; the update's statistics combine (``merge_update_stats``); the engine's
    error and failure counts add up (its other figures are rank 0's); each time is the slowest
    rank's (a step lasts as long as its slowest rank); the engine's infrastructure retry and
    failure counts add up too."""
    if len(parts) == 1:
        return parts[0]
    names = parts[0].rewards.per_function
    rewards = Rewards(
        [r for p in parts for r in p.rewards.totals],
        {name: [v for p in parts for v in p.rewards.per_function[name]] for name in names},
        {k: v for p in parts for k, v in p.rewards.errors.items()},
    )
    advantages = Advantages(
        torch.cat([p.advantages.values for p in parts]),
        **{name: sum(getattr(p.advantages, name) for p in parts) for name in COUNTS},
    )
    rollout = dict(parts[0].rollout)
    for key in ("infra_retries", "infra_failures"):
        if all(key in p.rollout for p in parts):
            rollout[key] = sum(p.rollout[key] for p in parts)
    for key in ("errors", "failures"):
        counts: dict[str, int] = {}
        for p in parts:
            for kind, n in p.rollout.get(key, {}).items():
                counts[kind] = counts.get(kind, 0) + n
        rollout[key] = counts
    times = {k: max(p.times[k] for p in parts) for k in parts[0].times}
    trajectories = [t for p in parts for t in p.trajectories]
    return RankStep(trajectories, rewards, advantages, merge_update_stats([p.update for p in parts]), rollout, times)


def merge_update_stats(stats: Sequence[UpdateStats]) -> UpdateStats:
    """One ``UpdateStats`` for the global batch from every rank's: losses are sums of globally
    weighted terms (so they add), fractions are weighted by each rank's policy tokens, the
    gradient norm is already global."""
    tokens = sum(s.policy_tokens for s in stats)
    n = max(tokens, 1)
    return replace(
        stats[0],
        loss=sum(s.loss for s in stats),
        policy_loss=sum(s.policy_loss for s in stats),
        kl=sum(s.kl for s in stats),
        clip_fraction=sum(s.clip_fraction * s.policy_tokens for s in stats) / n,
        mean_ratio=sum(s.mean_ratio * s.policy_tokens for s in stats) / n,
        behaviour_weight_mean=sum(s.behaviour_weight_mean * s.policy_tokens for s in stats) / n if tokens else 1.0,
        off_policy_tokens=sum(s.off_policy_tokens for s in stats),
        mismatch_kl=sum(s.mismatch_kl * s.policy_tokens for s in stats) / n,
        mismatch_max_abs_log_ratio=max(s.mismatch_max_abs_log_ratio for s in stats),
        micro_batches=sum(s.micro_batches for s in stats),
        tokens=sum(s.tokens for s in stats),
        policy_tokens=tokens,
    )


def step_metrics(
    step: int,
    trajectories: Sequence[Trajectory],
    rewards: Rewards,
    advantages: Advantages,
    update: UpdateStats,
    rollout: dict[str, Any],
    *,
    lr: float,
    times: dict[str, float],
) -> dict[str, Any]:
    """The step's line, in this order: rewards, advantages and infrastructure failures, the update,
    throughput and times, the engine's rollout metrics (the module docstring names every key)."""
    step_seconds = sum(times.values())
    return {
        "step": step,
        **reward_metrics(trajectories, rewards),
        **advantage_metrics(advantages),
        **infra_metrics(trajectories, advantages),
        **update_metrics(update, lr),
        "tokens_per_second": sum(len(t.token_ids) for t in trajectories) / step_seconds if step_seconds else None,
        **{f"time/{k}": v for k, v in times.items()},
        "time/step": step_seconds,
        **engine_metrics(rollout),
    }


def reward_metrics(trajectories: Sequence[Trajectory], rewards: Rewards) -> dict[str, Any]:
    """``reward/mean|std|min|max`` and ``reward/env/<task>`` over the episodes whose reward is known
    (an infrastructure failure has none to count), ``reward/fn/<name>`` and ``reward/errors``."""
    known = [(r, t) for r, t in zip(rewards.totals, trajectories) if t.outcome != "infra_failure"]
    totals = [r for r, _ in known]
    out: dict[str, Any] = {
        "reward/mean": statistics.fmean(totals) if totals else None,
        "reward/std": statistics.pstdev(totals) if totals else None,
        "reward/min": min(totals, default=None),
        "reward/max": max(totals, default=None),
    }
    for task in sorted({t.task_name for t in trajectories}):
        values = [r for r, t in known if t.task_name == task]
        out[f"reward/env/{task}"] = statistics.fmean(values) if values else None
    for name, values in rewards.per_function.items():
        out[f"reward/fn/{name}"] = mean_or_none(values)
    out["reward/errors"] = len(rewards.errors)
    return out


def advantage_metrics(advantages: Advantages) -> dict[str, Any]:
    """``advantage/mean|abs_mean`` (None without episodes: dynamic sampling kept none) and the group counts."""
    values = advantages.values
    return {
        "advantage/mean": float(values.mean()) if values.numel() else None,
        "advantage/abs_mean": float(values.abs().mean()) if values.numel() else None,
        "advantage/zero_variance_groups": advantages.zero_variance_groups,
        "advantage/groups": advantages.groups,
    }


def update_metrics(update: UpdateStats, lr: float) -> dict[str, Any]:
    """The update's losses, ratios, off-policy correction and mismatch, gradient norm, learning rate
    and token counts."""
    return {
        "loss": update.loss,
        "policy_loss": update.policy_loss,
        "kl": update.kl,
        "clip_fraction": update.clip_fraction,
        "mean_ratio": update.mean_ratio,
        "behaviour_weight_mean": update.behaviour_weight_mean,
        "off_policy_tokens": update.off_policy_tokens,
        **mismatch_metrics(update),
        "grad_norm": update.grad_norm,
        "lr": lr,
        "policy_tokens": update.policy_tokens,
        "trained_tokens": update.tokens,
        "micro_batches": update.micro_batches,
    }


def engine_metrics(rollout: dict[str, Any]) -> dict[str, Any]:
    """The engine's numeric rollout metrics under ``rollout/``, its error and failure counts under
    ``rollout/errors/<kind>`` and ``rollout/failures/<kind>``."""
    out: dict[str, Any] = {}
    for key, value in rollout.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) or value is None:
            out[f"rollout/{key}"] = value
    for kind, count in rollout.get("errors", {}).items():
        out[f"rollout/errors/{kind}"] = count
    for kind, count in rollout.get("failures", {}).items():
        out[f"rollout/failures/{kind}"] = count
    return out


def mismatch_metrics(update: UpdateStats) -> dict[str, float | None]:
    """How far the behaviour logprobs (the engine's) were from the trainer's before the update, on
    the policy tokens the update forwarded (None without any)."""
    seen = update.policy_tokens > 0
    return {
        "mismatch/kl": update.mismatch_kl if seen else None,
        "mismatch/max_abs_log_ratio": update.mismatch_max_abs_log_ratio if seen else None,
        "mismatch/off_policy_share": update.off_policy_tokens / update.policy_tokens if seen else None,
    }


def infra_metrics(trajectories: Sequence[Trajectory], advantages: Advantages) -> dict[str, Any]:
    """What infrastructure failures cost a batch (``Trajectory.outcome``; ``advantages`` computed
    with those episodes excluded): ``infra/failed_episodes`` (still failing after their retries),
    ``infra/retries`` (reruns, summed), ``infra/groups_shrunk`` and ``infra/groups_lost``
    (``Advantages.shrunk_groups`` / ``lost_groups``), ``infra/reward_lost`` (the share of the
    batch's episodes whose reward is unknown: what they would have added to the mean cannot be
    known, only their count and their groups), and ``episodes/policy_failures`` (episodes that
    failed by the model's own doing: their reward counts)."""
    outcomes = [t.outcome for t in trajectories]
    failed = outcomes.count("infra_failure")
    return {
        "infra/failed_episodes": failed,
        "infra/retries": sum(t.retries for t in trajectories),
        "infra/groups_shrunk": advantages.shrunk_groups,
        "infra/groups_lost": advantages.lost_groups,
        "infra/reward_lost": failed / len(trajectories) if trajectories else None,
        "episodes/policy_failures": outcomes.count("policy_failure"),
    }
