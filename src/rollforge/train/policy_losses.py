"""The policy losses beside PPO's clipped token loss, and the registry ``algorithm.policy_loss`` names.

Each is a ``PolicyLoss`` (``losses.py``): the same correction, KL term, aggregation weights and
statistics; only the objective (and GSPO's level) differ. Below, r_t = exp(log_ratio_t) is the
token's ratio to the correction's anchor (the behaviour policy under ``none``, the proximal one
under ``decoupled``/``masked``), A the episode's advantage, n_i the policy tokens of sequence i.

``gspo`` (Zheng et al. 2025, "Group Sequence Policy Optimization", Qwen): one importance ratio per
sequence, the geometric mean of its tokens' ratios, clipped at the sequence level::

    s_i     = exp(1/n_i * sum_t log r_t)                         # over sequence i's policy tokens
    J_i     = min(s_i * A_i, clip(s_i, 1 - clip_low, 1 + clip_high) * A_i)

implemented in the paper's token form (GSPO-token), which has GSPO's value and gradient when a
sequence's tokens share one advantage (they do here)::

    s_i,t   = sg[s_i] * pi(y_t) / sg[pi(y_t)]                   # value s_i, d s_i,t / d logp_t = s_i
    pg_t    = -min(s_i,t * A_i, clip(s_i,t, 1 - clip_low, 1 + clip_high) * A_i)

With ``loss_aggregation: sequence`` (w_t = 1 / (G n_i)) the loss is exactly the paper's
-1/G sum_i J_i and its gradient -1/G sum_i A_i s_i 1/n_i sum_t grad logp_t on unclipped sequences;
``token`` and ``fixed`` weigh a sequence by its length instead. Clip range: the paper's 3e-4 /
4e-4 (section 5.1): s_i is a per-token geometric mean, so it moves far less than a token's ratio.
A sequence that takes the clipped branch gives no gradient at all, and ``clip_fraction`` counts
all its tokens. A
*sequence* is one update row: a trajectory's segment (a trajectory whose template rewrote history
has several, each a sequence of its own, as under ``SequenceMean``); a row is never split across
micro-batches, so its mean is always over its own tokens. Under a correction the behaviour weight
is taken per sequence too: b_i = exp(1/n_i sum_t log b_t), truncated or masked as a whole.

``cispo`` (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention"): clip the importance-sampling weight, not the update, and keep every token's REINFORCE
gradient::

    pg_t    = -sg[clip(r_t, 1 - clip_low, 1 + clip_high)] * A * logp_t
    grad    = -clip(r_t, ...) * A * grad logp_t                  # never 0: a clipped token still learns

Defaults: clip_low 1.0 (no lower bound: the paper sets eps_low high and tunes only eps_high),
clip_high 3.0 (weights capped at 4, Tinker's CISPO default after ScaleRL, Khatri et al. 2025;
MiniMax-M1 gives no value). ``clip_fraction`` counts the tokens whose weight was clipped. The
loss *value* is -w A logp, not comparable with ``ppo``'s -r A; its gradient at r = 1 is the same.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .corrections import make_correction, resolve_correction
from .losses import ClippedPolicyLoss, Objective, PolicyLoss


class GSPOLoss(ClippedPolicyLoss):
    """GSPO: PPO's clipped objective on each sequence's geometric-mean ratio (module docstring)."""

    name = "gspo"
    default_clip = (3e-4, 4e-4)

    def level(self, values: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
        """Each row's mean over its policy tokens ``on``, on each of them (0 off them)."""
        zero = torch.zeros_like(values)
        means = torch.where(on, values, zero).sum(dim=1, keepdim=True) / on.sum(dim=1, keepdim=True).clamp(min=1)
        return torch.where(on, means.expand_as(values), zero)

    def log_ratios(self, logprobs, log_ratio, on):
        own = torch.where(on, logprobs - logprobs.detach(), torch.zeros_like(logprobs))  # 0, with logp_t's gradient
        return self.level(log_ratio, on).detach() + own


class CISPOLoss(PolicyLoss):
    """CISPO: the detached, clipped importance weight times REINFORCE (module docstring)."""

    name = "cispo"
    default_clip = (1.0, 3.0)

    def objective(self, logprobs, log_ratio, advantages, on):
        ratio = torch.exp(log_ratio).detach()
        weight = torch.clamp(ratio, 1 - self.clip_low, 1 + self.clip_high)
        pg = -weight * advantages * torch.where(on, logprobs, torch.zeros_like(logprobs))
        return Objective(pg, ratio, weight != ratio)


#: ``algorithm.policy_loss`` -> its class.
POLICY_LOSSES: dict[str, type[PolicyLoss]] = {kind.name: kind for kind in (ClippedPolicyLoss, GSPOLoss, CISPOLoss)}


def policy_loss(
    name: str = "ppo",
    *,
    correction: str = "auto",
    clip_low: float | None = None,
    clip_high: float | None = None,
    kl_beta: float = 0.0,
    cap: float = 2.0,
    max_staleness: int = 0,
    backend: str = "hf",
) -> PolicyLoss:
    """The policy loss ``name`` (``algorithm.policy_loss``) with the off-policy ``correction``
    (``auto`` resolved for ``max_staleness`` and the generation ``backend``: ``resolve_correction``).
    ``clip_low``/``clip_high`` None: the loss's own defaults; ``cap``: ``importance_cap``."""
    if name not in POLICY_LOSSES:
        raise ConfigError(f"unknown policy_loss {name!r}; expected one of {sorted(POLICY_LOSSES)}")
    chosen = make_correction(resolve_correction(correction, max_staleness, backend), cap)
    return POLICY_LOSSES[name](clip_low, clip_high, kl_beta, chosen)
