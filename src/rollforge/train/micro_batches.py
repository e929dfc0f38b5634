"""How one update's episodes (``update.UpdateRow``s: ``ids``, ``prompt_length``) are cut into
micro-batches, and which of them need no forward pass at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Sequence

import torch


@dataclass(frozen=True)
class MicroBatch:
    rows: list[int]  # episode indices
    prefix: int = 0  # length of a prompt all rows share, computed once (0: none)


def plan_micro_batches(
    episodes: Sequence[Any], group_size: int, micro_batch_tokens: int, skip: Collection[int] = ()
) -> list[MicroBatch]:
    """Groups (``group_size`` consecutive episodes of one prompt) whose prompt tokens are identical
    share one forward pass of that prompt: the group's rows run as a batch on top of its cached
    keys and values (gradients flow back through them), so a prompt is computed once instead of
    ``group_size`` times. A group too large for the budget is split into row chunks (each computes
    the prompt once). Without groups, episodes are packed by length. The rows in ``skip`` are left
    out (``silent_rows``)."""
    if group_size < 2:
        kept = [i for i in range(len(episodes)) if i not in skip]
        return [
            MicroBatch([kept[j] for j in rows])
            for rows in pack_micro_batches([episodes[i].ids.numel() for i in kept], micro_batch_tokens)
        ]
    out = []
    for start in range(0, len(episodes), group_size):
        members = [i for i in range(start, min(start + group_size, len(episodes))) if i not in skip]
        if not members:
            continue
        prefix = shared_prefix([episodes[i] for i in members])
        chunk: list[int] = []
        for i in sorted(members, key=lambda i: -episodes[i].ids.numel()):
            longest = episodes[chunk[0]].ids.numel() if chunk else episodes[i].ids.numel()
            if chunk and prefix + (len(chunk) + 1) * (longest - prefix) > micro_batch_tokens:
                out.append(MicroBatch(chunk, prefix))
                chunk = []
            chunk.append(i)
        out.append(MicroBatch(chunk, prefix))
    return out


def shares_prompts(setting: bool | str, device: Any) -> bool:
    """Whether the update runs groups behind their shared prompt (``optim.share_prompts`` on
    ``device``): ``auto`` on a CPU only, where it saves compute; on CUDA padded rows ran faster."""
    return device.type == "cpu" if setting == "auto" else bool(setting)


def shared_prefix(episodes: Sequence[Any]) -> int:
    """The prompt length when every episode starts with the same prompt ids and continues past it
    (at least one token each); else 0."""
    length = min(e.prompt_length for e in episodes)
    first = episodes[0].ids[:length]
    if length < 1 or any(e.ids.numel() <= length or not torch.equal(e.ids[:length], first) for e in episodes):
        return 0
    return length


def pack_micro_batches(lengths: Sequence[int], micro_batch_tokens: int) -> list[list[int]]:
    """Indices grouped so that rows x longest row <= micro_batch_tokens (longest first)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= micro_batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def silent_rows(
    advantages: torch.Tensor, weights: Sequence[torch.Tensor], loss_fn: Any, reference: Any, zero_advantage: bool = True
) -> set[int]:
    """Rows whose loss and gradient are exactly zero, which are not forwarded: rows with no token in
    the loss (every weight 0: a failed or stale episode), and, with ``zero_advantage`` and no KL
    term, rows with no advantage on any token (a GRPO group whose rewards are all equal)."""
    silent = {i for i, w in enumerate(weights) if not bool(w.any())}
    if not zero_advantage or reference is not None or getattr(loss_fn, "kl_beta", 0.0) > 0:
        return silent
    flat = advantages.reshape(len(advantages), -1)
    return silent | {int(i) for i in torch.nonzero(~flat.ne(0).any(dim=1)).flatten()}


#: ``optim.micro_batch_tokens: auto`` off CUDA, and its floor on CUDA (a CPU's measured setting).
CPU_MICRO_BATCH_TOKENS = 4096
#: Its ceiling on CUDA: past this, a longer pass no longer raises a GPU's utilisation much.
CUDA_MICRO_BATCH_TOKENS_MAX = 65536


def micro_batch_tokens_for(setting: int | str, model: Any) -> int:
    """``optim.micro_batch_tokens`` for ``model`` where it lives: a number as given; ``auto``:
    ``CPU_MICRO_BATCH_TOKENS`` off CUDA, and on CUDA as many tokens as half the free memory holds at
    ``activation_bytes_per_token`` (the other half: the head's logit chunks, the optimizer's
    transients, fragmentation), in multiples of 1024 from that floor to ``CUDA_MICRO_BATCH_TOKENS_MAX``.
    (An estimate: never yet run on a GPU.)"""
    if setting != "auto":
        return int(setting)
    device = next(model.parameters()).device
    if device.type != "cuda":
        return CPU_MICRO_BATCH_TOKENS
    free, _ = torch.cuda.mem_get_info(device)
    fits = free // 2 // activation_bytes_per_token(model.config) // 1024 * 1024
    return max(CPU_MICRO_BATCH_TOKENS, min(CUDA_MICRO_BATCH_TOKENS_MAX, fits))


def activation_bytes_per_token(config: Any) -> int:
    """What the backward pass keeps per token of a decoder in bfloat16: per layer about 10 hidden
    widths (norm inputs, q/k/v/o, the residual) and 4 MLP widths (gate, up, their product, the
    activation), 2 bytes each, the norms' float32 copies taken into the factor of 2 on top: 2.5 MB
    for Qwen3-0.6B, whose update on an H100 used 2.9 MB a token more from 4,096 tokens to 16,384
    (docs/benchmarks.md), which the free half ``micro_batch_tokens_for`` leaves covers."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    hidden = text.hidden_size
    mlp = getattr(text, "intermediate_size", None) or 4 * hidden
    return 2 * 2 * text.num_hidden_layers * (10 * hidden + 4 * mlp)
