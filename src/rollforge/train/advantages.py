"""Group-relative advantages: one scalar per episode from the rewards of its group.

Episodes are grouped by prompt (``group_size`` consecutive episodes share one prompt). Each
estimator is a small class with one method, registered by name:

- ``grpo``: (r - mean) / (std + eps), the population std of the group (GRPO, DeepSeekMath).
- ``grpo_no_std`` / ``dr_grpo``: r - mean (Dr.GRPO drops the std, which over-weights groups that are
  nearly all right or all wrong; pair it with the ``fixed`` loss aggregation).
- ``rloo``: r - mean of the *other* members of the group (leave-one-out baseline).

A group whose rewards are all equal carries no signal: every estimator gives it zero advantage,
and ``zero_variance_groups`` counts such groups so that a run that has stopped learning shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError

EPS = 1e-6


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # (N,) one per episode, in input order
    zero_variance_groups: int
    groups: int


class GroupMean:
    """r - group mean, optionally divided by the group std."""

    def __init__(self, scale_by_std: bool):
        self.scale_by_std = scale_by_std

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:  # (G, K) -> (G, K)
        centred = rewards - rewards.mean(dim=1, keepdim=True)
        if self.scale_by_std:
            centred = centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + EPS)
        return centred


class LeaveOneOut:
    """r_i - mean_{j != i} r_j = K / (K - 1) * (r_i - mean)."""

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        k = rewards.shape[1]
        return (rewards - rewards.mean(dim=1, keepdim=True)) * k / (k - 1)


ESTIMATORS = {
    "grpo": lambda: GroupMean(scale_by_std=True),
    "grpo_no_std": lambda: GroupMean(scale_by_std=False),
    "dr_grpo": lambda: GroupMean(scale_by_std=False),
    "rloo": LeaveOneOut,
}


def compute_advantages(rewards: list[float] | torch.Tensor, group_size: int, estimator: str = "grpo") -> Advantages:
    """Advantages of ``rewards`` (N = groups x group_size, grouped consecutively)."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {estimator!r}; expected one of {sorted(ESTIMATORS)}")
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if group_size < 2 or r.numel() % group_size:
        raise ConfigError(f"{r.numel()} rewards cannot be split into groups of {group_size} (need group_size >= 2)")
    groups = r.view(-1, group_size)  # (G, K)
    flat = (groups.max(dim=1).values - groups.min(dim=1).values) == 0  # (G,)
    values = ESTIMATORS[estimator]()(groups)
    values[flat] = 0.0
    return Advantages(values.reshape(-1).float(), int(flat.sum()), groups.shape[0])
