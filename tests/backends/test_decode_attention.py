"""The CPU decode attention of ``FAST_GQA_ATTENTION`` (``backends/cpu_speedups.py``): a one-token
step in bfloat16 runs as grouped matmuls with a float32 softmax instead of torch's bf16 SDPA kernel.
Checked against sdpa computed in float32 (the reference both should approximate), on a left-padded
batch whose padding must not leak into any row."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rollforge.backends.cpu_speedups import decode_attention

BATCH, HEADS, KV_HEADS, DIM, LENGTH = 4, 6, 2, 16, 12


def inputs(dtype):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(BATCH, HEADS, 1, DIM, generator=generator)
    key = torch.randn(BATCH, KV_HEADS, LENGTH, DIM, generator=generator)
    value = torch.randn(BATCH, KV_HEADS, LENGTH, DIM, generator=generator)
    allowed = torch.ones(BATCH, 1, 1, LENGTH, dtype=torch.bool)
    allowed[1, ..., :5] = False  # row 1 is left-padded by 5 columns
    return query.to(dtype), key.to(dtype), value.to(dtype), allowed


def reference(query, key, value, allowed):
    """sdpa in float32, (B, 1, H, D)."""
    q, k, v = query.float(), key.float(), value.float()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    return out.transpose(1, 2)


def test_float32_decode_attention_equals_sdpa():
    query, key, value, allowed = inputs(torch.float32)
    got = decode_attention(query, key, value, allowed, None)
    assert torch.allclose(got, reference(query, key, value, allowed), atol=1e-5)


def test_bfloat16_decode_attention_is_within_rounding_of_float32():
    query, key, value, allowed = inputs(torch.bfloat16)
    got = decode_attention(query, key, value, allowed, None)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), reference(query, key, value, allowed), atol=3e-2)


def test_padding_never_leaks_and_an_additive_mask_reads_the_same():
    query, key, value, allowed = inputs(torch.float32)
    poisoned_key, poisoned_value = key.clone(), value.clone()
    poisoned_key[1, :, :5], poisoned_value[1, :, :5] = 1e4, 1e4  # what row 1 must not see
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    clean = decode_attention(query, key, value, allowed, None)
    for mask in (allowed, additive):
        got = decode_attention(query, poisoned_key, poisoned_value, mask, None)
        assert torch.allclose(got[1], clean[1], atol=1e-5)
    unpadded = decode_attention(query[1:2], key[1:2, :, 5:], value[1:2, :, 5:], None, None)
    assert torch.allclose(clean[1:2], unpadded, atol=1e-5)
