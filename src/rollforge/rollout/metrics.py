"""Rollout metrics, named as in the step-style rollout design (NeMo-RL), from finished trajectories.

A mean over no values is reported as ``None`` (missing), never NaN. Timing: ``generation_seconds``
and ``environment_seconds`` are summed over episodes (they overlap in async mode), ``wall_seconds``
is the rollout's wall time. ``infra_retries``: reruns after infrastructure failures, summed;
``infra_failures``: episodes whose last run still failed that way (``Trajectory.outcome``).

Rewards are those of the episodes that training learns from: an infrastructure failure's reward is
unknown, not 0 (training drops it from its group's baseline, ``train/advantages.py``), so
``mean_total_reward``, ``max_total_reward`` and ``min_total_reward`` (and their per-task means)
leave those episodes out; ``rewarded_episodes`` says how many count. A policy failure (the model's
own doing, e.g. a template error) keeps its reward.

On a Ray cluster (any episode with ``Trajectory.served_by``), ``episodes_by_node`` counts the
episodes each node served, per side: ``{"environment": {node id: episodes}, "generation": {...}}``
(a side only when some episode ran it on Ray).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Sequence

from ..types import Trajectory


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _known_rewards(trajectories: Iterable[Trajectory]) -> list[float]:
    """The total rewards that count (see the module docstring)."""
    return [t.total_reward for t in trajectories if t.outcome != "infra_failure"]


def rollout_metrics(trajectories: Sequence[Trajectory], wall_seconds: float | None = None) -> dict[str, Any]:
    n = len(trajectories)
    turns = [t.turns for t in trajectories]
    rewards = _known_rewards(trajectories)
    generated = [t.generated_tokens for t in trajectories]
    totals = [len(t.token_ids) for t in trajectories]
    env_tokens = [total - t.prompt_length - gen for t, total, gen in zip(trajectories, totals, generated)]
    failures = Counter(f.kind for t in trajectories for f in t.failures)
    errors = Counter(t.error.kind for t in trajectories if t.error is not None)

    def rate(flags: Iterable[bool]) -> float | None:
        return sum(flags) / n if n else None

    metrics: dict[str, Any] = {
        "episodes": n,
        "total_turns": sum(turns),
        "avg_turns_per_sample": _mean(turns),
        "max_turns_per_sample": max(turns, default=None),
        "natural_termination_rate": rate(t.terminated for t in trajectories),
        "truncation_rate": rate(t.truncated for t in trajectories),
        "max_turns_reached_rate": rate(t.max_turns_reached for t in trajectories),
        "error_rate": rate(t.error is not None for t in trajectories),
        "mean_total_tokens_per_sample": _mean(totals),
        "mean_gen_tokens_per_sample": _mean(generated),
        "mean_env_tokens_per_sample": _mean(env_tokens),
        "rewarded_episodes": len(rewards),
        "mean_total_reward": _mean(rewards),
        "max_total_reward": max(rewards, default=None),
        "min_total_reward": min(rewards, default=None),
        "generation_seconds": sum(t.generation_seconds for t in trajectories),
        "environment_seconds": sum(t.environment_seconds for t in trajectories),
        "infra_retries": sum(t.retries for t in trajectories),
        "infra_failures": sum(t.outcome == "infra_failure" for t in trajectories),
        "errors": dict(sorted(errors.items())),
        "failures": dict(sorted(failures.items())),
        "per_task": _per_task(trajectories),
    }
    by_node = _episodes_by_node(trajectories)
    if by_node:
        metrics["episodes_by_node"] = by_node
    if wall_seconds is not None:
        metrics["wall_seconds"] = wall_seconds
        metrics["generated_tokens_per_second"] = sum(generated) / wall_seconds if wall_seconds > 0 else None
    return metrics


def _episodes_by_node(trajectories: Sequence[Trajectory]) -> dict[str, dict[str, int]]:
    counts: dict[str, Counter] = {}
    for t in trajectories:
        for side, placement in t.served_by.parts().items():
            counts.setdefault(side, Counter())[placement.node] += 1
    return {side: dict(sorted(count.items())) for side, count in counts.items()}


def _per_task(trajectories: Sequence[Trajectory]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.task_name, []).append(t)
    return {
        name: {
            "episodes": len(group),
            "rewarded_episodes": len(_known_rewards(group)),
            "mean_total_reward": _mean(_known_rewards(group)),
            "avg_turns_per_sample": _mean([t.turns for t in group]),
            "error_rate": sum(t.error is not None for t in group) / len(group),
        }
        for name, group in sorted(groups.items())
    }
