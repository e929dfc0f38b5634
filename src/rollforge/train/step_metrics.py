"""The flat metrics dict of one training step (one line of ``metrics.jsonl``).

Keys: ``step``; ``reward/mean|std|min|max``; ``reward/env/<task>`` (mean total per environment);
``reward/fn/<name>`` (mean of a reward function over the samples it applied to, None when it
applied to none) and ``reward/errors``; ``advantage/mean|abs_mean``, ``advantage/zero_variance_groups``
and ``advantage/groups``; the update's ``loss``, ``policy_loss``, ``kl``, ``clip_fraction``,
``mean_ratio``, ``grad_norm``, ``lr``; token counts and ``tokens_per_second``; ``time/*``
(rollout = generation and environments, update, sync, step); and the engine's rollout metrics
under ``rollout/``. A mean over nothing is None, never NaN.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from ..types import Trajectory
from .advantages import Advantages
from .rewards import Rewards, mean_or_none
from .update import UpdateStats


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
    totals = rewards.totals
    out: dict[str, Any] = {
        "step": step,
        "reward/mean": statistics.fmean(totals),
        "reward/std": statistics.pstdev(totals),
        "reward/min": min(totals),
        "reward/max": max(totals),
    }
    for task in sorted({t.task_name for t in trajectories}):
        out[f"reward/env/{task}"] = statistics.fmean(r for r, t in zip(totals, trajectories) if t.task_name == task)
    for name, values in rewards.per_function.items():
        out[f"reward/fn/{name}"] = mean_or_none(values)
    out["reward/errors"] = len(rewards.errors)
    values = advantages.values
    out.update({
        "advantage/mean": float(values.mean()),
        "advantage/abs_mean": float(values.abs().mean()),
        "advantage/zero_variance_groups": advantages.zero_variance_groups,
        "advantage/groups": advantages.groups,
        "loss": update.loss,
        "policy_loss": update.policy_loss,
        "kl": update.kl,
        "clip_fraction": update.clip_fraction,
        "mean_ratio": update.mean_ratio,
        "grad_norm": update.grad_norm,
        "lr": lr,
        "policy_tokens": update.policy_tokens,
        "trained_tokens": update.tokens,
        "micro_batches": update.micro_batches,
    })
    step_seconds = sum(times.values())
    out["tokens_per_second"] = sum(len(t.token_ids) for t in trajectories) / step_seconds if step_seconds else None
    out.update({f"time/{k}": v for k, v in times.items()})
    out["time/step"] = step_seconds
    for key, value in rollout.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) or value is None:
            out[f"rollout/{key}"] = value
    for kind, count in rollout.get("errors", {}).items():
        out[f"rollout/errors/{kind}"] = count
    for kind, count in rollout.get("failures", {}).items():
        out[f"rollout/failures/{kind}"] = count
    return out
