"""Training throughput: tokens/s, seconds per step and model FLOPs utilisation (MFU) of real
``policy_update`` calls (forward, backward and AdamW step) on random token ids.

Each step updates on ``batch`` sequences of ``seq_len`` random token ids with every token in the
loss (advantage 1), as one micro-batch, on ``--device`` in ``--dtype`` (float32 master weights,
bfloat16 under autocast, as training does; see ``train/policy.py``). ``warmup`` steps run first
and are not timed; each timed step ends with a device synchronisation.

Model FLOPs per trained token (PaLM, appendix B; nanoGPT's ``estimate_mfu``)::

    flops_per_token = 6 * N + 12 * L * d_attn * T

- ``N``: the parameters that multiply activations: every parameter but the input embedding
  table, with the output projection counted once whether or not it is tied to that table (for
  SmolLM2-135M the 576 x 49152 head is a fifth of the work). Norm weights are counted too
  (negligible). The factor 6 is 2 (multiply-add) x 3 (forward, and a backward twice as costly).
- ``12 * L * d_attn * T``: attention scores and their weighted sum over the ``T = seq_len``
  positions, ``L`` layers, ``d_attn = heads x head_dim``, counted for the full T x T square
  (causal masking halves the useful part; the convention counts it whole).

Achieved FLOP/s = flops_per_token x tokens/s; MFU = achieved / peak, the peak being ``--peak-flops``
or, for bfloat16 on a GPU named in ``PEAK_BF16_FLOPS`` (dense tensor-core figures from the
vendors' data sheets), that entry. Otherwise (CPU, float32, an unknown GPU) ``mfu`` is null.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

#: Dense bfloat16 tensor-core peaks (FLOP/s), matched against ``torch.cuda.get_device_name()``.
PEAK_BF16_FLOPS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "A100": 312e12,
}


#: Memory bandwidths (bytes/s) from the vendors' data sheets, matched against the device name the
#: same way: ``bench gpu``'s generation floor.
MEMORY_BANDWIDTH: dict[str, float] = {
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,  # SXM
    "H200": 4.8e12,
    "A100": 2.0e12,  # 80 GB SXM
}


def model_flops_per_token(model: Any, seq_len: int) -> tuple[int, int]:
    """``(N, flops_per_token)`` of the module docstring's formula."""
    inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
    params = {id(p): p.numel() for p in model.parameters()}  # a tied weight counts once
    params.pop(id(inputs.weight), None)
    if outputs is not None:
        params[id(outputs.weight)] = outputs.weight.numel()
    n = sum(params.values())
    config = model.config.get_text_config(decoder=True)
    d_attn = config.num_attention_heads * head_dim(config)
    return n, 6 * n + 12 * config.num_hidden_layers * d_attn * seq_len


def head_dim(config: Any) -> int:
    """A text config's attention head size: its own ``head_dim``, else hidden size over heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def peak_flops(device: Any, dtype: Any) -> tuple[float | None, str | None]:
    """The table's peak for bfloat16 on a known GPU, with the name it matched; else (None, None)."""
    import torch

    if dtype != torch.bfloat16:
        return None, None
    return _match(device, PEAK_BF16_FLOPS, "bf16 dense")


def _match(device: Any, table: dict[str, float], what: str) -> tuple[float | None, str | None]:
    """``table``'s entry for a CUDA ``device``'s name (keys most specific first) and where it came
    from; (None, None) on another device or an unknown GPU."""
    import torch

    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    for key, value in table.items():
        if key in name:
            return value, f"{name} (table: {key} {what})"
    return None, None


def memory_bandwidth(device: Any) -> tuple[float | None, str | None]:
    """The table's memory bandwidth of a known GPU, with the name it matched; else (None, None)."""
    return _match(device, MEMORY_BANDWIDTH, "memory bandwidth")


@dataclass(frozen=True)
class Workload:
    """What the benchmark updates on: ``steps`` timed updates (after ``warmup`` untimed ones) of
    ``batch`` sequences of ``seq_len`` random token ids drawn with ``seed``."""

    batch: int = 8
    seq_len: int = 512
    steps: int = 5
    warmup: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("batch", 1), ("seq_len", 2), ("steps", 1), ("warmup", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"{name} must be >= {low}, got {getattr(self, name)}")


def run(
    model_name: str = "smollm2-135m",
    workload: Workload = Workload(),
    device: str = "auto",
    dtype: str = "auto",
    peak: float | None = None,
) -> dict[str, Any]:
    import torch

    from ..models import load_model, resolve_device, resolve_dtype

    if peak is not None and peak <= 0:
        raise ConfigError(f"peak FLOP/s must be > 0, got {peak}")
    where = resolve_device(device)
    compute = resolve_dtype(dtype, where)
    model, tokenizer = load_model(model_name, dtype=torch.float32, device=where)
    times = timed_steps(model, tokenizer.pad_token_id or 0, where, compute, workload)
    batch, seq_len, steps = workload.batch, workload.seq_len, workload.steps
    tokens = batch * seq_len * steps
    seconds = sum(times)
    n, flops_per_token = model_flops_per_token(model, seq_len)
    tokens_per_s = tokens / seconds
    achieved = flops_per_token * tokens_per_s
    peak_source = "--peak-flops" if peak is not None else None
    if peak is None:
        peak, peak_source = peak_flops(where, compute)
    return {
        "model": str(model_name),
        "device": str(where),
        "device_name": torch.cuda.get_device_name(where) if where.type == "cuda" else "cpu",
        "dtype": str(compute).removeprefix("torch."),
        "batch": batch,
        "seq_len": seq_len,
        "steps": steps,
        "tokens": tokens,
        "seconds": seconds,
        "step_s": seconds / steps,
        "step_s_min": min(times),
        "tokens_per_s": tokens_per_s,
        "matmul_params": n,
        "flops_per_token": flops_per_token,
        "flops_formula": "6 * N + 12 * layers * heads * head_dim * seq_len",
        "achieved_flops_per_s": achieved,
        "peak_flops_per_s": peak,
        "peak_source": peak_source,
        "mfu": achieved / peak if peak else None,
    }


def timed_steps(model: Any, pad_id: int, where: Any, compute: Any, workload: Workload) -> list[float]:
    """Seconds of each of the workload's ``steps`` updates (after ``warmup`` untimed ones) of ``update_step``."""
    import torch

    model.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    step = update_step(model, optimizer, pad_id, where, compute, workload.batch, workload.seq_len, workload.seed)
    for _ in range(workload.warmup):
        step()
    times = []
    for _ in range(workload.steps):
        began = time.perf_counter()
        step()
        times.append(time.perf_counter() - began)
    return times


def update_step(
    model: Any, optimizer: Any, pad_id: int, where: Any, compute: Any, batch: int, seq_len: int, seed: int
) -> Any:
    """A function taking one ``policy_update`` (ending with a device synchronisation) on ``batch`` x
    ``seq_len`` random token ids (the same every call), every token in the loss, as one micro-batch;
    it returns the update's statistics."""
    import torch

    from ..train.losses import ClippedPolicyLoss, TokenMean
    from ..train.update import TrainedPolicy, UpdateRow, UpdateSettings, policy_update

    generator = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (batch, seq_len), generator=generator)  # (B, T)
    mask = torch.ones(seq_len)  # every token in the loss (the first has no context and scores 0)
    episodes = [UpdateRow(row, mask, torch.zeros(seq_len)) for row in ids]
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.ones(batch)
    loss_fn = ClippedPolicyLoss()
    policy = TrainedPolicy(model, optimizer)
    settings = UpdateSettings(micro_batch_tokens=batch * seq_len, pad_id=pad_id, compute_dtype=compute)

    def step() -> Any:
        stats = policy_update(policy, episodes, advantages, weights, loss_fn, settings)
        if where.type == "cuda":
            torch.cuda.synchronize(where)
        return stats

    return step


def add_arguments(parser: Any) -> None:
    parser.add_argument("--model", default="smollm2-135m", help="a model directory or an alias")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32 or bfloat16 (compute precision)")
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="peak FLOP/s for the MFU (default: the GPU table)"
    )


def main(args: Any) -> dict[str, Any]:
    workload = Workload(args.batch, args.seq_len, args.steps, args.warmup)
    return run(args.model, workload, args.device, args.dtype, args.peak_flops)
