"""The current policy's log-probability of each token it is trained on, from one forward pass.

The logprob of token i comes from the logits at position i - 1, so a forward pass over ids[:-1]
scores ids[1:]. The vocabulary projection runs only on the positions that predict a target token
(for a small model it is the costliest matmul of the forward and backward), chunk by chunk past
``LOGIT_BUDGET`` logits. A batch whose rows start with the same prompt (a GRPO group,
``micro_batches.plan_micro_batches``) computes that prompt once; its rows continue from the
prompt's cached keys and values unpadded, packed end to end with a block-causal mask. A model
sharded with FSDP runs the decoder and head as one forward of its root (``SHARDED_FORWARD``), so
every rank's collectives line up.

The update (``update.py``) and SFT (``recipes/sft.py``) score their batches here; tests compare
these logprobs with the ones generation recorded.
"""

from __future__ import annotations

from typing import Any

import torch

from .distributed import is_sharded


def sequence_logprobs(
    model: Any, ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor, prefix: int = 0
) -> torch.Tensor:
    """(B, T) logprob under ``model`` of each token where ``targets`` is true, given the tokens
    before it; 0 elsewhere (and at position 0, which has no context). With ``prefix`` > 0 every
    row starts with the same ``prefix`` ids, which are computed once for the batch.

    The vocabulary projection is the costliest matmul of a small model's forward and backward
    (576 x 49152 per token for SmolLM2-135M), so when the model's logits are plain ``lm_head(h)``
    it is applied only to the hidden states that predict a target token; otherwise the logits are
    computed from the first target onward.
    """
    batch, length = ids.shape
    rows, cols = targets[:, 1:].nonzero(as_tuple=True)  # token cols + 1 is a target
    out = torch.zeros(batch, length, device=ids.device)
    if rows.numel() == 0:
        return out
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    picked = ids[rows, cols + 1]
    if _plain_lm_head(base):
        if is_sharded(model):  # one decoder pass, so every rank's FSDP collectives line up
            out[rows, cols + 1] = _sharded_forward(model)(ids, attention, rows, cols, picked, 0)
        else:
            out[rows, cols + 1] = _head_logprobs(model, ids, attention, rows, cols, picked, prefix)
        return out
    first = int(cols.min())
    keep = length - first
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep, use_cache=False).logits
    out[rows, cols + 1] = picked_logprobs(logits[rows, cols - first], picked)
    return out


#: Logits (tokens x vocabulary) the head computes at once before it goes chunk by chunk, and the
#: size of a chunk; each chunk is recomputed in the backward pass. A 16k-token pack of a 152k-id
#: vocabulary would hold 10 GiB of float32 logits and as much again for their gradient: on an H100
#: a Qwen3-0.6B pack ran out of memory there (2026-11-26); in chunks of 2**30 logits it ran at 36% MFU.
LOGIT_BUDGET, LOGIT_CHUNK = 2**30, 2**28


def picked_logprobs(logits: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """(N,) float32 log-softmax of the (N, V) ``logits`` at the ids ``picked``."""
    logits = logits.float()
    return logits.gather(-1, picked[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _head_and_logprobs(head: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    return picked_logprobs(head(hidden), picked)


def _target_logprobs(head: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """(N,) logprobs of ``picked`` under ``head`` applied to the (N, H) ``hidden``; past
    ``LOGIT_BUDGET`` logits, ``LOGIT_CHUNK`` at a time (chunks recomputed in the backward pass)."""
    weight = getattr(head, "weight", None)
    if weight is None or hidden.shape[0] * weight.shape[0] <= LOGIT_BUDGET:
        return _head_and_logprobs(head, hidden, picked)
    step = max(1, LOGIT_CHUNK // weight.shape[0])
    from torch.utils.checkpoint import checkpoint

    chunks = zip(hidden.split(step), picked.split(step))
    if not torch.is_grad_enabled():
        return torch.cat([_head_and_logprobs(head, h, p) for h, p in chunks])
    return torch.cat([checkpoint(_head_and_logprobs, head, h, p, use_reentrant=False) for h, p in chunks])


def _head_logprobs(
    model: Any,
    ids: torch.Tensor,
    attention: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    picked: torch.Tensor,
    prefix: int,
) -> torch.Tensor:
    """(N,) logprobs of the ids ``picked`` at the positions (rows, cols) only: the decoder over every
    token (the shared ``prefix`` once), then the head on the hidden states that predict a target."""
    batch = ids.shape[0]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    if prefix:
        shared = decoder(input_ids=ids[:1, :prefix], use_cache=True)
        rest = _packed_continuations(decoder, ids, attention.sum(dim=1), prefix, shared.past_key_values)
        hidden = torch.cat([shared.last_hidden_state.expand(batch, -1, -1), rest], dim=1)
    else:
        hidden = decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    return _target_logprobs(base.get_output_embeddings(), hidden[rows, cols], picked)


#: The name under which a sharded model runs ``_head_logprobs`` as an FSDP forward of its root (the
#: root gathers its own weights, the embeddings and the head, and reduces their gradients).
SHARDED_FORWARD = "rollforge_head_logprobs"


def _sharded_forward(model: Any) -> Any:
    """``_head_logprobs`` as a forward of the FSDP root ``model``, registered on its first use (so
    whoever shards the model, ``distributed.shard``, needs to know nothing of the update)."""
    if not hasattr(model, SHARDED_FORWARD):
        import types

        from torch.distributed.fsdp import register_fsdp_forward_method

        setattr(model, SHARDED_FORWARD, types.MethodType(_head_logprobs, model))
        register_fsdp_forward_method(model, SHARDED_FORWARD)
    return getattr(model, SHARDED_FORWARD)


def _packed_continuations(
    decoder: Any, ids: torch.Tensor, lengths: torch.Tensor, prefix: int, cache: Any
) -> torch.Tensor:
    """(B, T - prefix, H) hidden states of every row's tokens after the shared ``prefix`` (whose keys
    and values are in ``cache``, batch 1), zero on padding. The rows run unpadded, end to end as one
    sequence: each token attends to the prefix and to its own row's earlier tokens (a block-causal
    mask, positions restarting at ``prefix`` per row), so no compute goes to padding."""
    batch, length = ids.shape
    rests = (lengths - prefix).tolist()
    owner = torch.repeat_interleave(torch.arange(batch, device=ids.device), lengths - prefix)  # (S,)
    offset = torch.cat([torch.arange(n, device=ids.device) for n in rests])  # (S,) index within its row
    flat = ids[owner, prefix + offset][None]  # (1, S)
    own_past = (owner[:, None] == owner[None, :]) & (offset[:, None] >= offset[None, :])  # (S, S)
    mask = torch.cat([own_past.new_ones(len(owner), prefix), own_past], dim=1)[None, None]  # (1, 1, S, prefix + S)
    out = decoder(
        input_ids=flat, attention_mask=mask, position_ids=(prefix + offset)[None], past_key_values=cache, use_cache=True
    )
    hidden = out.last_hidden_state[0]  # (S, H)
    return hidden.new_zeros(batch, length - prefix, hidden.shape[-1]).index_put((owner, offset), hidden)


def _plain_lm_head(model: Any) -> bool:
    """Whether the model's logits are exactly ``get_output_embeddings()(decoder output)``."""
    config = model.config.get_text_config(decoder=True)
    scaled = any(
        getattr(config, name, None) not in (None, 1, 1.0) for name in ("final_logit_softcapping", "logit_scale")
    )
    return not scaled and callable(getattr(model, "get_decoder", None)) and model.get_output_embeddings() is not None
