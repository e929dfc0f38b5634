"""Group-relative advantages: one scalar per episode from the rewards of its group.

Episodes are grouped by prompt (``group_size`` consecutive episodes share one prompt). Each
estimator is a small class with one method, registered by name:

- ``grpo``: (r - mean) / (std + eps), the population std of the group (GRPO, DeepSeekMath).
- ``grpo_no_std`` / ``dr_grpo``: r - mean (Dr.GRPO drops the std, which over-weights groups that are
  nearly all right or all wrong; pair it with the ``fixed`` loss aggregation).
- ``rloo``: r - mean of the *other* members of the group (leave-one-out baseline).

A group whose rewards are all equal carries no signal: every estimator gives it zero advantage,
and ``zero_variance_groups`` counts such groups so that a run that has stopped learning shows it.

Excluded members (``keep`` False: episodes that failed for infrastructure reasons, whose reward is
unknown rather than zero) get advantage exactly 0 and are left out of their group's statistics:
mean and std are taken over the kept members, and the leave-one-out baseline over the other kept
ones (K becomes the kept count). The group shrinks (``shrunk_groups``); a group left with fewer
than two kept members has no baseline and contributes nothing (``lost_groups``; it is not counted
as a zero-variance group). With nobody excluded the computation is exactly the one without ``keep``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import ConfigError

EPS = 1e-6


@dataclass(frozen=True)
class Advantages:
    values: torch.Tensor  # (N,) one per episode, in input order
    zero_variance_groups: int
    groups: int
    excluded: int = 0  # episodes left out of their group's statistics (advantage 0)
    shrunk_groups: int = 0  # groups with at least one excluded member and two or more kept
    lost_groups: int = 0  # groups with fewer than two kept members (all advantages 0)


class GroupMean:
    """r - group mean, optionally divided by the group std (over the kept members)."""

    def __init__(self, scale_by_std: bool):
        self.scale_by_std = scale_by_std

    def __call__(self, rewards: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:  # (G, K) -> (G, K)
        if kept is None:
            centred = rewards - rewards.mean(dim=1, keepdim=True)
            if self.scale_by_std:
                centred = centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + EPS)
            return centred
        centred, n = _centred(rewards, kept)
        if self.scale_by_std:  # the population std of the kept members
            centred = centred / (((centred**2).sum(dim=1, keepdim=True) / n).sqrt() + EPS)
        return centred


class LeaveOneOut:
    """r_i - mean_{j != i} r_j = K / (K - 1) * (r_i - mean), K the kept members of the group."""

    def __call__(self, rewards: torch.Tensor, kept: torch.Tensor | None = None) -> torch.Tensor:
        if kept is None:
            k = rewards.shape[1]
            return (rewards - rewards.mean(dim=1, keepdim=True)) * k / (k - 1)
        centred, n = _centred(rewards, kept)
        k = n.clamp(min=2)  # groups with fewer than 2 kept are zeroed by the caller
        return centred * k / (k - 1)


def _centred(rewards: torch.Tensor, kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r - mean over the kept members, 0 at the others whatever their reward, NaN included;
    the kept count per group, at least 1): (G, K), (G, 1)."""
    n = kept.sum(dim=1, keepdim=True).clamp(min=1)
    mean = torch.where(kept, rewards, 0.0).sum(dim=1, keepdim=True) / n
    return torch.where(kept, rewards - mean, 0.0), n


ESTIMATORS = {
    "grpo": lambda: GroupMean(scale_by_std=True),
    "grpo_no_std": lambda: GroupMean(scale_by_std=False),
    "dr_grpo": lambda: GroupMean(scale_by_std=False),
    "rloo": LeaveOneOut,
}


def compute_advantages(
    rewards: list[float] | torch.Tensor,
    group_size: int,
    estimator: str = "grpo",
    keep: Sequence[bool] | None = None,
) -> Advantages:
    """Advantages of ``rewards`` (N = groups x group_size, grouped consecutively); ``keep`` (N
    booleans, None: all) marks the members that count (see the module docstring)."""
    if estimator not in ESTIMATORS:
        raise ConfigError(f"unknown advantage estimator {estimator!r}; expected one of {sorted(ESTIMATORS)}")
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if group_size < 2 or r.numel() % group_size:
        raise ConfigError(f"{r.numel()} rewards cannot be split into groups of {group_size} (need group_size >= 2)")
    if keep is not None and len(keep) != r.numel():
        raise ConfigError(f"keep has {len(keep)} entries for {r.numel()} rewards; expected one per reward")
    groups = r.view(-1, group_size)  # (G, K)
    if keep is None or all(keep):
        flat = (groups.max(dim=1).values - groups.min(dim=1).values) == 0  # (G,)
        values = ESTIMATORS[estimator]()(groups)
        values[flat] = 0.0
        return Advantages(values.reshape(-1).float(), int(flat.sum()), groups.shape[0])
    kept = torch.as_tensor(list(keep), dtype=torch.bool).view(-1, group_size)  # (G, K)
    count = kept.sum(dim=1)  # (G,)
    lost = count < 2
    spread = (
        groups.masked_fill(~kept, -torch.inf).max(dim=1).values - groups.masked_fill(~kept, torch.inf).min(dim=1).values
    )
    flat = (spread == 0) & ~lost  # (G,)
    values = ESTIMATORS[estimator]()(groups, kept)
    values[flat | lost] = 0.0
    return Advantages(
        values.reshape(-1).float(),
        int(flat.sum()),
        groups.shape[0],
        excluded=int((~kept).sum()),
        shrunk_groups=int(((count < group_size) & ~lost).sum()),
        lost_groups=int(lost.sum()),
    )
