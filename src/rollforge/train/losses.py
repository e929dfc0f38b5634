"""The clipped token-level policy-gradient loss and how it is averaged.

Per policy token t of an episode with advantage A (tokens with loss mask 0 never contribute)::

    ratio_t = exp(logp_t - logp_old_t)          # current policy vs the generation (behaviour) policy
    pg_t    = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1     # k3 estimator, >= 0 (only if kl_beta > 0)
    loss    = sum_t w_t * (pg_t + kl_beta * kl_t)

``logp_old`` are the logprobs the backend returned while generating (the *behaviour* policy), so
the ratio corrects for any drift between the engine and the trainer (and for several optimizer
steps on one batch). This is the ``none`` correction; when generation runs ahead of training
(``max_staleness`` > 0) the behaviour policy lags the trained one by several versions and
``corrections.py`` splits the ratio in two (AReaL's decoupled loss, masked importance sampling):
those classes subclass ``ClippedPolicyLoss`` and change only ``anchor`` (what the ratio is taken
against and a detached factor on each token's loss).

The weights ``w_t`` come from an *aggregation*, a small class per variant, computed once for the
whole batch so that micro-batching and gradient accumulation give exactly the full-batch gradient:

- ``token``: w = 1 / (policy tokens in the batch)       (DAPO: long answers weigh by their length)
- ``sequence``: w = 1 / (episodes x policy tokens of the episode)   (GRPO: each episode weighs 1)
- ``fixed``: w = 1 / (episodes x max_loss_tokens)        (Dr.GRPO: no length bias)

The counts are over the whole batch: on several ranks, ``total`` sums a rank's count over all of
them (``Ranks.total``), so each rank's weights are its share of the global normaliser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ConfigError


Total = Callable[[float], float]


def _local(value: float) -> float:
    return value


class TokenMean:
    def weights(self, masks: list[torch.Tensor], total: Total = _local) -> list[torch.Tensor]:
        tokens = total(sum(float(m.sum()) for m in masks))
        return [m / tokens if tokens else m * 0 for m in masks]


class SequenceMean:
    def weights(self, masks: list[torch.Tensor], total: Total = _local) -> list[torch.Tensor]:
        counted = total(sum(1 for m in masks if m.sum() > 0))
        return [m / (counted * m.sum()) if m.sum() > 0 else m * 0 for m in masks]


class FixedNormalizer:
    def __init__(self, max_loss_tokens: int):
        if max_loss_tokens < 1:
            raise ConfigError(f"max_loss_tokens must be >= 1, got {max_loss_tokens}")
        self.max_loss_tokens = max_loss_tokens

    def weights(self, masks: list[torch.Tensor], total: Total = _local) -> list[torch.Tensor]:
        episodes = total(len(masks))
        return [m / (episodes * self.max_loss_tokens) for m in masks]


def get_aggregation(name: str, max_loss_tokens: int | None = None):
    if name == "token":
        return TokenMean()
    if name == "sequence":
        return SequenceMean()
    if name == "fixed":
        if max_loss_tokens is None:
            raise ConfigError("loss aggregation 'fixed' needs max_loss_tokens")
        return FixedNormalizer(max_loss_tokens)
    raise ConfigError(f"unknown loss aggregation {name!r}; expected one of ['fixed', 'sequence', 'token']")


@dataclass(frozen=True)
class LossParts:
    loss: torch.Tensor  # scalar, differentiable
    policy_loss: float  # sum_t w_t pg_t
    kl: float  # sum_t w_t kl_t (0 without a reference)
    clipped_tokens: int  # tokens whose objective took the clipped branch
    tokens: int  # policy tokens seen
    ratio_sum: float
    behaviour_weight_sum: float  # sum over policy tokens of the correction's factor (none: 1 each)
    off_policy_tokens: int  # policy tokens the correction truncated or masked (none: 0)


class ClippedPolicyLoss:
    """PPO-style clipped objective on tokens, with an optional k3 KL penalty to a reference: the
    ``none`` off-policy correction, ratio_t = exp(logp_t - logp_old_t) against the behaviour policy.
    ``proximal_logprobs`` are ignored (subclasses that use them set ``needs_proximal``)."""

    needs_proximal = False

    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.2, kl_beta: float = 0.0):
        if clip_low < 0 or clip_high < 0 or kl_beta < 0:
            raise ConfigError(f"clip_low, clip_high and kl_beta must be >= 0, got {clip_low}, {clip_high}, {kl_beta}")
        self.clip_low, self.clip_high, self.kl_beta = clip_low, clip_high, kl_beta

    def __call__(
        self,
        logprobs: torch.Tensor,  # (B, T) current policy, differentiable
        old_logprobs: torch.Tensor,  # (B, T) behaviour policy
        advantages: torch.Tensor,  # (B,) or (B, T)
        weights: torch.Tensor,  # (B, T) aggregation weights, 0 off the loss mask
        ref_logprobs: torch.Tensor | None = None,  # (B, T)
        proximal_logprobs: torch.Tensor | None = None,  # (B, T) policy before this batch's update, detached
    ) -> LossParts:
        if advantages.dim() == 1:
            advantages = advantages[:, None]
        on = weights != 0
        anchor, factor, off_policy = self.anchor(old_logprobs, proximal_logprobs, on)
        log_ratio = torch.where(on, logprobs - anchor, torch.zeros_like(logprobs))
        ratio = torch.exp(log_ratio)
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high) * advantages
        pg = -torch.minimum(unclipped, clipped)  # (B, T)
        live = on if factor is None else on & (factor != 0)  # tokens whose loss counts
        policy_loss = ((weights if factor is None else weights * factor) * pg).sum()
        loss = policy_loss
        kl_value = 0.0
        if self.kl_beta > 0:
            if ref_logprobs is None:
                raise ConfigError("kl_beta > 0 needs reference logprobs")
            delta = torch.where(on, ref_logprobs - logprobs, torch.zeros_like(logprobs))
            kl = torch.exp(delta) - delta - 1
            kl_term = (weights * kl).sum()
            loss = loss + self.kl_beta * kl_term
            kl_value = float(kl_term.detach())
        return LossParts(
            loss=loss,
            policy_loss=float(policy_loss.detach()),
            kl=kl_value,
            clipped_tokens=int(((clipped < unclipped) & live).sum()),
            tokens=int(on.sum()),
            ratio_sum=float(ratio.detach()[on].sum()),
            behaviour_weight_sum=float(on.sum()) if factor is None else float(factor[on].sum()),
            off_policy_tokens=off_policy,
        )

    def anchor(
        self, old_logprobs: torch.Tensor, proximal_logprobs: torch.Tensor | None, on: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """What the ratio is taken against, the detached factor on each token's loss (None: 1
        everywhere) and how many policy tokens (``on``) the correction truncated or masked. Here:
        the behaviour logprobs, no factor, none."""
        return old_logprobs, None, 0
