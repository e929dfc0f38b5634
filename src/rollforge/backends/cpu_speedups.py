"""CPU fast paths of the HF backend: they save time, and change no number beyond rounding.

- ``FAST_GQA_ATTENTION``: an attention implementation registered with transformers that runs
  grouped-query attention with a padding mask fused on CPU, instead of materialising repeated keys
  and values as transformers' "sdpa" does there. ``HFBackend`` switches a model to it while open
  when ``can_switch_to_fast_gqa`` says the model qualifies. A one-token decode step in half
  precision (bfloat16, float16) runs as two grouped matmuls with a float32 softmax
  (``decode_attention``) instead: torch's half-precision SDPA kernel is several times slower on CPU
  (SmolLM2-135M, batch 32, 420 cached tokens, one thread: 816 ms a decode step with it, 216 ms
  without, 2026-11-29). Its numbers differ from sdpa's by half-precision rounding; in float32 the
  path is sdpa's own, so float32 models get sdpa's numbers exactly.
- ``release_idle_openmp_threads``: frees the idle OpenMP pool of the calling (event-loop) thread,
  so that libgomp does not throttle the backend's worker thread.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

#: transformers' "sdpa" attention, except for grouped-query attention with a mask on CPU: there
#: transformers materialises the repeated keys/values (the fused GQA path is only safe on CUDA
#: without a mask), while torch's CPU kernels handle ``enable_gqa`` with a mask directly. Same
#: numbers, much less memory traffic per decode step. Registered under its own name; ``HFBackend``
#: switches a model to it only with ``fast_gqa=True`` and restores "sdpa" on close.
FAST_GQA_ATTENTION = "rollforge_sdpa_gqa"


def _sdpa_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("position_bias") is None and kwargs.get("cache") is None
    if not grouped or not plain or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if query.shape[2] == 1 and query.dtype in (torch.bfloat16, torch.float16) and not dropout:
        return decode_attention(query, key, value, attention_mask, scaling), None
    if attention_mask is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, H, T, D)
    return output.transpose(1, 2).contiguous(), None


def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """(B, 1, H, D) attention of one new token per row over its cached keys and values: ``query``
    (B, H, 1, D), ``key``/``value`` (B, H_kv, L, D) with H a multiple of H_kv (each key head serves
    H / H_kv query heads), ``mask`` (B, 1, 1, L), True (or 0.0) where a row may attend (None:
    everywhere). The scores and the softmax are float32; the two matmuls run in the inputs'
    precision."""
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # (B, H_kv, G, D)
    scale = scaling if scaling is not None else dim**-0.5
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # (B, H_kv, G, L)
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask == 0
        scores = scores.masked_fill(~allowed.reshape(batch, 1, 1, -1), float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(weights, value).reshape(batch, 1, heads, dim)


AttentionInterface.register(FAST_GQA_ATTENTION, _sdpa_gqa_attention)
AttentionMaskInterface.register(FAST_GQA_ATTENTION, sdpa_mask)


def can_switch_to_fast_gqa(model: Any, device: torch.device) -> bool:
    """Whether ``model`` runs "sdpa" on CPU with grouped-query attention: what this path speeds up."""
    config = model.config.get_text_config(decoder=True)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    grouped = heads is not None and kv_heads < heads
    return device.type == "cpu" and grouped and model.config._attn_implementation == "sdpa"


def release_idle_openmp_threads() -> bool:
    """Release the OpenMP worker threads the *calling* thread keeps for its parallel regions.

    Why: torch's Linux wheels use libgomp, where every thread that ran a parallel torch op keeps its
    own pool of worker threads. Once the pools hold more threads than there are CPUs, libgomp
    shortens its spin-waits for all of them, and every op then pays futex wake-ups: on a 2-core box
    the backend's worker thread ran decode steps ~35% slower while the event-loop thread (which
    loaded the model) kept its idle pool. ``omp_pause_resource_all`` (OpenMP 5.0) frees the calling
    thread's pool; libgomp recreates it on that thread's next parallel op, so this never changes
    results. Returns False when the runtime is not libgomp (nothing is done).
    """
    pause = _libgomp_pause()
    return pause is not None and pause(1) == 0  # 1 = omp_pause_soft


@functools.lru_cache(maxsize=1)
def _libgomp_pause() -> Callable[[int], int] | None:
    try:
        with open("/proc/self/maps") as maps:
            libraries = sorted({line.split()[-1] for line in maps if "libgomp" in line})
    except OSError:  # not Linux
        return None
    for library in libraries:
        try:
            pause = ctypes.CDLL(library).omp_pause_resource_all
        except (OSError, AttributeError):  # pre-OpenMP-5 libgomp
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        return pause
    return None
