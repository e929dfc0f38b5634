"""One supervised fine-tuning step: the masked NLL and the update that descends it.

The loss is the mean negative log-likelihood of the tokens whose loss mask is 1 (``MaskedNLLLoss``:
per-token weights 1/N over the N mask-1 tokens of the whole batch, so micro-batches accumulate to
the batch's mean). ``sft_update`` is one optimizer step on a batch of examples, ``sft_loss`` the same
number without a step (for evaluation and tests). Both forward through the GRPO update's parts:
token-budget micro-batches (``micro_batches``), ``collate`` and ``train.vision.batch_logprobs``,
which is the text path's masked logprob pass for text rows and a forward with each row's pixels for
an example that shows images (``Example.images``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..errors import ConfigError
from ..train.micro_batches import plan_micro_batches
from ..train.update import UpdateRow, collate, mixed_precision, optimizer_step
from ..train.vision import batch_logprobs
from .sft_data import Example


class MaskedNLLLoss:
    """``-sum(w * logprobs)`` with per-token weights ``w`` that are 1/N on the N mask-1 tokens of
    the whole batch and 0 elsewhere: the batch's mean token NLL, accumulable over micro-batches."""

    @staticmethod
    def weights(masks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        total = sum(float(m.sum()) for m in masks)
        if not total:
            raise ConfigError("the batch has no tokens with loss mask 1: nothing to train on")
        return [m / total for m in masks]

    def __call__(self, logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:  # (B, T), (B, T)
        return -(weights * logprobs).sum()


@dataclass(frozen=True)
class SFTStats:
    loss: float  # mean NLL over the batch's mask-1 tokens
    grad_norm: float
    tokens: int  # tokens forwarded
    loss_tokens: int  # mask-1 tokens
    micro_batches: int


def sft_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    examples: Sequence[Example],
    *,
    micro_batch_tokens: int,
    pad_id: int,
    max_grad_norm: float | None = None,
    compute_dtype: torch.dtype = torch.float32,
    scheduler: Any = None,
) -> SFTStats:
    """One optimizer (and ``scheduler``) step on ``examples``: micro-batches, accumulated NLL, clip,
    step; on the model's device, the forward passes in ``compute_dtype`` (bfloat16: under autocast)."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total, tokens, batches = _forward(model, examples, micro_batch_tokens, pad_id, compute_dtype, backward=True)
    grad_norm = optimizer_step(model, optimizer, max_grad_norm, scheduler)
    return SFTStats(total, grad_norm, tokens, sum(sum(e.mask) for e in examples), batches)


def sft_loss(
    model: Any, examples: Sequence[Example], *, micro_batch_tokens: int, pad_id: int, compute_dtype=torch.float32
) -> float:
    """The loss ``sft_update`` descends on ``examples`` (their mean NLL over mask-1 tokens, the
    pixels of their images in the forward pass), without a gradient or a step."""
    with torch.no_grad():
        return _forward(model, examples, micro_batch_tokens, pad_id, compute_dtype, backward=False)[0]


def _forward(
    model: Any, examples: Sequence[Example], budget: int, pad_id: int, dtype: torch.dtype, backward: bool
) -> tuple[float, int, int]:
    """(the masked NLL, tokens forwarded, micro-batches) of ``examples``, each micro-batch's loss
    backpropagated when ``backward`` (the gradient accumulates over the batch)."""
    device = next(model.parameters()).device
    loss_fn = MaskedNLLLoss()
    episodes = [_episode(e) for e in examples]
    weights = loss_fn.weights([e.mask for e in episodes])
    total, tokens = 0.0, 0
    batches = plan_micro_batches(episodes, 1, budget)
    for batch in batches:
        rows = [episodes[i] for i in batch.rows]
        ids, attention, _, w = collate(rows, [weights[i] for i in batch.rows], pad_id, device)
        with mixed_precision(device, dtype):
            logprobs = batch_logprobs(model, rows, ids, attention, w != 0)  # (B, T); an image row: with its pixels
            loss = loss_fn(logprobs, w)
        if backward:
            loss.backward()
        total += float(loss.detach())
        tokens += int(attention.sum())
    return total, tokens, len(batches)


def _episode(example: Example) -> UpdateRow:
    mask = torch.tensor(example.mask, dtype=torch.float32)
    ids = torch.tensor(example.ids, dtype=torch.long)
    return UpdateRow(ids, mask, torch.zeros_like(mask), example.prompt_length, example.images)
