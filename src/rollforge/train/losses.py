"""Policy losses: the skeleton every one shares, the clipped token-level loss (``ppo``), and how a
loss is averaged over tokens.

Per policy token t of an episode with advantage A (tokens with loss mask 0 never contribute)::

    ratio_t = exp(logp_t - logp_old_t)          # current policy vs the generation (behaviour) policy
    pg_t    = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)
    kl_t    = exp(ref_t - logp_t) - (ref_t - logp_t) - 1     # k3 estimator, >= 0 (only if kl_beta > 0)
    loss    = sum_t w_t * (f_t * pg_t + kl_beta * kl_t)

``logp_old`` are the logprobs the backend returned while generating (the *behaviour* policy), so
the ratio corrects for any drift between the engine and the trainer (and for several optimizer
steps on one batch). A ``PolicyLoss`` is three parts:

- its *correction* (``Correction``) says what the ratio is taken against and the detached factor
  f_t on each token's pg_t. Here ``none``: the behaviour logprobs, f = 1. When the behaviour
  policy lags the trained one or is another engine, ``corrections.py`` takes the ratio against
  the *proximal* policy (the trainer before this batch's update) and f_t is the truncated or
  masked behaviour weight (AReaL's decoupled loss, masked importance sampling);
- its *objective* turns the log-ratios into pg_t: PPO's clipped ratio above (``ClippedPolicyLoss``,
  ``ppo``), or GSPO's and CISPO's (``policy_losses.py``);
- its *level* (``level``): the loss weighs tokens (here) or whole sequences (GSPO); the
  correction's behaviour weight is taken at the same level.

The KL term, the weights and the statistics (``LossParts``) are the skeleton's. Every call also
measures the engine/trainer *mismatch* on its policy tokens, whatever the correction: with
g_t = logp_trainer_t - logp_old_t (the trainer's logprobs before this batch's update: the proximal
ones when given, else the current ones), the k3 estimate of KL(behaviour || trainer),
exp(g_t) - 1 - g_t, and the largest |g_t|. Generating with the trained model itself (``hf``) it
is ~0; another engine (vLLM, a server) or a lag shows here.

The weights ``w_t`` come from an *aggregation*, a small class per variant, computed once for the
whole batch so that micro-batching and gradient accumulation give exactly the full-batch gradient:

- ``token``: w = 1 / (policy tokens in the batch)       (DAPO: long answers weigh by their length)
- ``sequence``: w = 1 / (episodes x policy tokens of the episode)   (GRPO: each episode weighs 1)
- ``fixed``: w = 1 / (episodes x max_loss_tokens)        (Dr.GRPO: no length bias)

The counts are over the whole batch: on several ranks, ``total`` sums a rank's count over all of
them (``Ranks.total``), so each rank's weights are its share of the global normaliser.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, ClassVar

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
    policy_loss: float  # sum_t w_t f_t pg_t
    kl: float  # sum_t w_t kl_t (0 without a reference)
    clipped_tokens: int  # tokens whose objective took the clipped branch
    tokens: int  # policy tokens seen
    ratio_sum: float
    behaviour_weight_sum: float  # sum over policy tokens of the correction's factor (none: 1 each)
    off_policy_tokens: int  # policy tokens the correction truncated or masked (none: 0)
    mismatch_kl_sum: float = 0.0  # sum over policy tokens of k3 KL(behaviour || trainer before the update)
    mismatch_max_abs_log_ratio: float = 0.0  # max over policy tokens of |logp_trainer - logp_old|


@dataclass(frozen=True)
class Objective:
    """A loss's terms per token, each (B, T)."""

    pg: torch.Tensor  # the policy-gradient loss, differentiable
    ratio: torch.Tensor  # the importance ratio it used, detached (``mean_ratio``)
    clipped: torch.Tensor  # bool: the clip changed the token's term


Level = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Corrected = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # anchor, factor, cut


class Correction:
    """The ``none`` off-policy correction: the ratio against the behaviour logprobs, no factor."""

    needs_proximal = False

    def correct(
        self, old_logprobs: torch.Tensor, proximal_logprobs: torch.Tensor | None, on: torch.Tensor, level: Level
    ) -> Corrected:
        """What the ratio is taken against (B, T), the detached factor on each token's pg (None: 1
        everywhere) and where it truncated or masked (bool, None: nowhere). ``level(values, on)``
        takes per-token log weights to the loss's level (per token, or per sequence)."""
        return old_logprobs, None, None


class PolicyLoss(abc.ABC):
    """The skeleton of a policy loss (see the module docstring); a subclass gives ``objective``,
    its registry ``name`` and its paper's ``default_clip`` (clip_low, clip_high)."""

    name: ClassVar[str]
    default_clip: ClassVar[tuple[float, float]]

    def __init__(
        self,
        clip_low: float | None = None,
        clip_high: float | None = None,
        kl_beta: float = 0.0,
        correction: Correction | None = None,
    ):
        low, high = self.default_clip
        self.clip_low = low if clip_low is None else clip_low
        self.clip_high = high if clip_high is None else clip_high
        self.kl_beta, self.correction = kl_beta, correction or Correction()
        if self.clip_low < 0 or self.clip_high < 0 or kl_beta < 0:
            raise ConfigError(
                f"clip_low, clip_high and kl_beta must be >= 0, got {self.clip_low}, {self.clip_high}, {kl_beta}"
            )

    @property
    def needs_proximal(self) -> bool:
        """Whether the loss reads the proximal logprobs (the policy before this batch's update)."""
        return self.correction.needs_proximal

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
        anchor, factor, cut = self.correction.correct(old_logprobs, proximal_logprobs, on, self.level)
        log_ratio = torch.where(on, logprobs - anchor, torch.zeros_like(logprobs))
        terms = self.objective(logprobs, log_ratio, advantages, on)
        live = on if factor is None else on & (factor != 0)  # tokens whose loss counts
        policy_loss = ((weights if factor is None else weights * factor) * terms.pg).sum()
        kl_term = self.kl_term(logprobs, ref_logprobs, weights, on)
        trainer = logprobs if proximal_logprobs is None else proximal_logprobs
        kl_sum, largest = mismatch(old_logprobs, trainer, on)
        return LossParts(
            loss=policy_loss if kl_term is None else policy_loss + self.kl_beta * kl_term,
            policy_loss=float(policy_loss.detach()),
            kl=0.0 if kl_term is None else float(kl_term.detach()),
            clipped_tokens=int((terms.clipped & live).sum()),
            tokens=int(on.sum()),
            ratio_sum=float(terms.ratio[on].sum()),
            behaviour_weight_sum=float(on.sum()) if factor is None else float(factor[on].sum()),
            off_policy_tokens=0 if cut is None else int((cut & on).sum()),
            mismatch_kl_sum=kl_sum,
            mismatch_max_abs_log_ratio=largest,
        )

    @abc.abstractmethod
    def objective(
        self, logprobs: torch.Tensor, log_ratio: torch.Tensor, advantages: torch.Tensor, on: torch.Tensor
    ) -> Objective:
        """The per-token terms from the current ``logprobs``, their log-ratios to the correction's
        anchor (0 off the policy tokens ``on``) and the advantages ((B, 1) or (B, T))."""

    def level(self, values: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
        """Per-token log weights at the loss's level: per token, as they are."""
        return values

    def kl_term(
        self, logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None, weights: torch.Tensor, on: torch.Tensor
    ) -> torch.Tensor | None:
        """sum_t w_t kl_t (k3 to the reference), or None without the KL term (kl_beta 0)."""
        if self.kl_beta == 0:
            return None
        if ref_logprobs is None:
            raise ConfigError("kl_beta > 0 needs reference logprobs")
        delta = torch.where(on, ref_logprobs - logprobs, torch.zeros_like(logprobs))
        return (weights * (torch.exp(delta) - delta - 1)).sum()


def mismatch(old_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor, on: torch.Tensor) -> tuple[float, float]:
    """The engine/trainer mismatch on the policy tokens ``on``: the sum of the k3 estimates of
    KL(behaviour || trainer), exp(g) - 1 - g with g = logp_trainer - logp_old (>= 0; the tokens were
    sampled from the behaviour policy), and the largest |g| (0 without tokens)."""
    gap = torch.where(on, trainer_logprobs.detach() - old_logprobs, torch.zeros_like(old_logprobs))
    k3 = torch.expm1(gap) - gap
    return float(k3.sum()), float(gap.abs().max()) if gap.numel() else 0.0


class ClippedPolicyLoss(PolicyLoss):
    """PPO's clipped objective on tokens (``ppo``, the default): pg_t = -min(r_t A, clip(r_t,
    1 - clip_low, 1 + clip_high) A), r_t = exp(log_ratios_t). With the ``none`` correction the ratio
    is to the behaviour policy and ``proximal_logprobs`` serve only the mismatch statistics."""

    name = "ppo"
    default_clip = (0.2, 0.2)

    def objective(self, logprobs, log_ratio, advantages, on):
        ratio = torch.exp(self.log_ratios(logprobs, log_ratio, on))
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high) * advantages
        return Objective(-torch.minimum(unclipped, clipped), ratio.detach(), clipped < unclipped)

    def log_ratios(self, logprobs: torch.Tensor, log_ratio: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
        """The log-ratio each token's clipped term takes: its own."""
        return log_ratio
