"""Batched per-row sampling for the HF backend: one token per row from (B, V) logits.

Design:

- Greedy rows take the argmax. The others apply temperature, then top-k, then top-p, and draw by
  inverse CDF over the vocabulary in id order with a uniform pre-drawn for that row and step.
- Uniforms are drawn per request, up front, from a ``torch.Generator`` seeded by ``params.seed``
  (or by the backend's seeded RNG; ``draw_uniforms``), so a request's samples do not depend on which
  requests share its batch (up to float noise).
- The stored logprob of a token is ``log_softmax`` of the raw float32 logits, before temperature
  and filters.
- Top-k/top-p rank a window of the largest logits (``topk``) instead of sorting the vocabulary; the
  window grows only while some nucleus might extend past it. Rows are filtered by a per-row cutoff
  logit, so the draw never depends on other rows' filters.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import torch

from .base import SamplingParams

_TOP_P_WINDOW = 256  # logits ranked first when a row uses top-p (see _filter_cutoff)


@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling parameters as (B,) tensors, plus flags that let a step skip unused work."""

    greedy: torch.Tensor  # (B,) bool
    temperature: torch.Tensor  # (B,) float32, 1 for greedy rows
    top_p: torch.Tensor  # (B,) float32
    top_k: torch.Tensor  # (B,) int64, 0 = off
    any_sampled: bool
    any_top_p: bool
    max_top_k: int  # 0 when no row uses top-k

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu") -> RowSampling:
        greedy = [p.greedy for p in params]
        return cls(
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            temperature=torch.tensor([1.0 if g else p.temperature for g, p in zip(greedy, params)], device=device),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            any_sampled=not all(greedy),
            any_top_p=any(p.top_p < 1 and not g for g, p in zip(greedy, params)),
            max_top_k=max((p.top_k for g, p in zip(greedy, params) if not g), default=0),
        )


def sample(logits: torch.Tensor, uniforms: torch.Tensor, sampling: RowSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row from logits (B, V) with uniforms (B,); return tokens (B,) and their
    logprobs (B,) under the raw distribution."""
    logits = logits.float()  # (B, V)
    tokens = logits.argmax(dim=-1)  # (B,)
    if sampling.any_sampled:
        # The draw walks the vocabulary in id order whatever filters the other rows use, so a row's
        # token depends only on its own logits, parameters and uniform.
        drawn = _inverse_cdf(filtered_probs(logits / sampling.temperature[:, None], sampling), uniforms)
        tokens = torch.where(sampling.greedy, tokens, drawn)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs


def filtered_probs(scaled: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    """softmax(scaled) with the tokens that top-k, then top-p, remove set to 0 (not renormalised).
    ``scaled``: temperature-scaled logits (B, V), in vocabulary order."""
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    if sampling.any_top_p or sampling.max_top_k:
        cutoff = _filter_cutoff(scaled, sampling)  # (B,)
        probs = probs.masked_fill(scaled < cutoff[:, None], 0.0)
    return probs


def _filter_cutoff(scaled: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    """Per row, the smallest scaled logit that survives top-k then top-p (-inf: no filter).

    Only the largest ``width`` logits are ranked (``topk``): a full sort of a 50k vocabulary costs
    as much as a forward pass on CPU. The window starts at max(top_k, 256) and grows only while a
    top-p row's nucleus might extend past it."""
    vocab = scaled.shape[1]
    width = min(vocab, max(sampling.max_top_k, _TOP_P_WINDOW if sampling.any_top_p else 0))
    k = torch.where(sampling.top_k > 0, sampling.top_k, vocab)  # (B,)
    while True:
        values = scaled.topk(width, dim=-1).values  # (B, W), descending
        kept = k.clamp(max=width)
        if not sampling.any_top_p:
            break
        kept, covered = _top_p_kept(scaled, values, k, kept, sampling.top_p)
        if covered or width == vocab:
            break
        width = min(vocab, width * 4)
    cutoff = values.gather(1, (kept - 1)[:, None]).squeeze(1)  # (B,)
    filtered = (sampling.top_k > 0) | (sampling.top_p < 1)
    return torch.where(filtered, cutoff, torch.full_like(cutoff, float("-inf")))


def _top_p_kept(
    scaled: torch.Tensor, values: torch.Tensor, k: torch.Tensor, kept: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, bool]:
    """How many of the top ``values`` the nucleus keeps, and whether the window held every nucleus.

    Probabilities are those of the top-k distribution: normalised over the first k values (top_k
    rows, whose top-k set fits the window) or over the whole vocabulary. A token is dropped once the
    mass before it reaches top_p; rows with top_p == 1 are exempt (round-off could drop their tail).
    """
    width = values.shape[1]
    in_top_k = torch.arange(width, device=values.device)[None, :] < kept[:, None]  # (B, W)
    windowed = values.masked_fill(~in_top_k, float("-inf"))
    normaliser = torch.where(k <= width, windowed.logsumexp(dim=-1), scaled.logsumexp(dim=-1))  # (B,)
    probs = (windowed - normaliser[:, None]).exp()  # (B, W)
    mass = probs.cumsum(dim=-1)
    threshold = torch.where(top_p < 1, top_p, torch.inf)
    nucleus = ((mass - probs) < threshold[:, None]).sum(dim=-1)  # (B,), >= 1
    # A nucleus that fills the window without reaching top_p may continue past it.
    spills = (top_p < 1) & (k > width) & (mass[:, -1] < threshold)
    return torch.minimum(kept, nucleus), not bool(spills.any())


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index i with cdf[i-1] <= u * total < cdf[i]; never a zero-probability entry. (B, K) -> (B,)."""
    cdf = probs.cumsum(dim=-1)  # (B, K)
    total = cdf[:, -1]
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)


def draw_uniforms(
    params: Sequence[SamplingParams], budgets: Sequence[int], seeds: random.Random, device: torch.device
) -> torch.Tensor:
    """(B, max budget) uniforms: row i's sampler uses column t for its t-th token. Greedy rows get
    zeros; a request without a seed of its own takes one from ``seeds``."""
    # Drawn on the CPU (the same numbers on every device), then moved to the model's.
    uniforms = torch.zeros(len(params), max(budgets), device="cpu")
    for i, (row_params, budget) in enumerate(zip(params, budgets)):
        if row_params.greedy:
            continue
        seed = row_params.seed if row_params.seed is not None else seeds.getrandbits(63)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        uniforms[i, :budget] = torch.rand(budget, generator=generator, device="cpu")
    return uniforms.to(device)
