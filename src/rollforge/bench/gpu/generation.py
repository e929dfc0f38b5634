"""The ``generation`` section of ``rollforge bench gpu``: the same sampled requests through each way
of generating with one transformers model, measured against the memory floor.

Requests: ``batch_size x generations`` rows, each a prompt of ``prompt_tokens`` random ids (seeded,
no special tokens), sampled at temperature 1 up to ``max_new_tokens`` (a random model almost never
ends a turn, so every row runs to the limit). The model is loaded once, in bfloat16 on CUDA and
float32 on a CPU, and every candidate generates from it (``CANDIDATES``):

- ``engine``: rollforge's ``HFBackend``, its own continuous batching over ``model.forward`` (today's
  default, and the only one of these that keeps every promise of the backend: exact token ids and
  logprobs, per-request sampling and seeds, stop strings, prefix reuse across turns);
- ``cb``: transformers' continuous batching (``model.generate_batch``: paged attention over sdpa,
  logprobs returned), CUDA graphs off, its cache sized here (left to size itself on a CPU, a tiny
  model's first call had not returned after 300 s);
- ``cb_graphs``: the same with CUDA graphs (CUDA only);
- ``static``: one ``model.generate`` over the left-padded rows with a static cache, which transformers
  compiles (``torch.compile``) on CUDA; on a CPU it runs uncompiled.

Each candidate runs once untimed (a few tokens: compilation and graph capture happen there), then
once timed. Reported per candidate: generated tokens, seconds, tokens/s, ms per decode step (the
seconds over the longest completion; prefill included), and ``floor_fraction``: the least time a
decode step can take, the bytes it must read (the weights once, plus the live KV cache at the mean
context, rows x (prompt + new / 2) tokens) over the device's memory bandwidth
(``train_throughput.MEMORY_BANDWIDTH``), over the measured ms per step. It is null where the
bandwidth is unknown (a CPU, a GPU not in the table). A candidate that fails is one line in its
entry and the others still run. Never run on a GPU yet: only ``--quick``, on a CPU.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sections import failed, release_memory
from .settings import GpuSettings

#: The candidates in the order they run; those needing CUDA are skipped elsewhere, saying so.
CANDIDATES = ("engine", "static", "cb", "cb_graphs")
NEEDS_CUDA = frozenset({"cb_graphs"})
#: Tokens of each candidate's untimed first run (``static``: all of them).
WARMUP_TOKENS = 8
#: How long continuous batching may go without delivering a result before it counts as hung.
RESULT_TIMEOUT_S = 300.0
#: A candidate, opened: new tokens per row -> each row's generated length.
Generate = Callable[[int], list[int]]


@dataclass(frozen=True)
class Requests:
    """What every candidate generates: ``prompts`` (token ids), each up to ``max_new_tokens``."""

    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int
    seed: int
    eos: int
    pad: int


def run(model_dir: Path, where: Any, s: GpuSettings) -> dict[str, Any]:
    """The section (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(where).eval()
    requests = make_requests(tokenizer, s)
    floor = floor_seconds(model, requests, where)
    candidates: dict[str, dict[str, Any]] = {}
    for name in CANDIDATES:
        if name in NEEDS_CUDA and where.type != "cuda":
            candidates[name] = {"status": "skipped", "reason": "no CUDA device"}
            continue
        candidates[name] = measure(RUNNERS[name], model, tokenizer, requests, floor["seconds"])
        release_memory()
    ok = {name: c for name, c in candidates.items() if c["status"] == "ok"}
    return {
        "rows": len(requests.prompts),
        "prompt_tokens": len(requests.prompts[0]),
        "max_new_tokens": requests.max_new_tokens,
        "dtype": str(dtype).removeprefix("torch."),
        "floor": floor,
        "candidates": candidates,
        "fastest": max(ok, key=lambda name: ok[name]["tokens_per_s"]) if ok else None,
        "default": "engine",
    }


def make_requests(tokenizer: Any, s: GpuSettings) -> Requests:
    """``batch_size x generations`` prompts of ``gen_prompt_tokens`` random ordinary ids."""
    special = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(s.seed)
    rows = s.batch_size * s.generations
    prompts = tuple(tuple(rng.choice(ordinary) for _ in range(s.gen_prompt_tokens)) for _ in range(rows))
    return Requests(prompts, s.max_new_tokens, s.seed, tokenizer.eos_token_id, tokenizer.pad_token_id)


def floor_seconds(model: Any, requests: Requests, where: Any) -> dict[str, Any]:
    """The least time one decode step can take on ``where``: bytes read / memory bandwidth."""
    from ..train_throughput import head_dim, memory_bandwidth

    config = model.config.get_text_config(decoder=True)
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    element = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * config.num_hidden_layers * kv_heads * head_dim(config) * element
    context = len(requests.prompts[0]) + requests.max_new_tokens / 2
    kv = round(len(requests.prompts) * context * kv_per_token)
    bandwidth, source = memory_bandwidth(where)
    return {
        "weight_bytes": weights,
        "kv_bytes_per_token": kv_per_token,
        "kv_bytes_at_mean_context": kv,
        "bytes_per_step": weights + kv,
        "bandwidth_bytes_per_s": bandwidth,
        "bandwidth_source": source,
        "seconds": (weights + kv) / bandwidth if bandwidth else None,
    }


def measure(opener: Callable[..., Any], model: Any, tokenizer: Any, requests: Requests, floor: float | None):
    """One candidate at its boundary: opened (untimed: a backend, a manager and its thread), an
    untimed run of ``WARMUP_TOKENS`` (all of them for ``static``, whose compiled graphs are sized by
    the length), a timed run, closed; its figures, or ``{"status": "failed", "reason": one line}``."""
    warmup = requests.max_new_tokens if opener is static_cache else min(WARMUP_TOKENS, requests.max_new_tokens)
    try:
        with opener(model, tokenizer, requests) as generate:
            generate(warmup)
            began = time.perf_counter()
            lengths = generate(requests.max_new_tokens)
            seconds = time.perf_counter() - began
    except Exception as exc:  # the boundary of a candidate: its failure is its entry's, not the section's
        return failed(exc)
    step = seconds / max(lengths)
    return {
        "status": "ok",
        "generated_tokens": sum(lengths),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(sum(lengths) / seconds, 1),
        "ms_per_decode_step": round(step * 1000, 3),
        "floor_fraction": round(floor / step, 4) if floor else None,
    }


@contextmanager
def engine(model: Any, tokenizer: Any, requests: Requests) -> Iterator[Generate]:
    """rollforge's ``HFBackend``, every request at once."""
    from ...backends.base import SamplingParams
    from ...backends.hf import HFBackend
    from ...backends.settings import HFSettings

    loop = asyncio.new_event_loop()
    backend = HFBackend(model, tokenizer, HFSettings(max_batch_size=len(requests.prompts), prefix_cache_mb=0))

    async def all_of(new_tokens: int) -> list[int]:
        completions = await asyncio.gather(
            *(
                backend.generate(p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=requests.seed + i))
                for i, p in enumerate(requests.prompts)
            )
        )
        return [len(c.token_ids) for c in completions]

    try:
        yield lambda new_tokens: loop.run_until_complete(all_of(new_tokens))
    finally:
        loop.run_until_complete(backend.close())
        loop.close()


@contextmanager
def static_cache(model: Any, tokenizer: Any, requests: Requests) -> Iterator[Generate]:
    """``model.generate`` over the rows (equal lengths: no padding) with a static cache; a row's
    length runs to and includes its end-of-turn token, where it samples one."""
    import torch

    ids = torch.tensor(requests.prompts, device=model.device)

    def generate(new_tokens: int) -> list[int]:
        torch.manual_seed(requests.seed)
        sampling = _sampling(requests, new_tokens)
        sampling.cache_implementation = "static"
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=sampling)
        new = out[:, ids.shape[1] :].tolist()
        return [row.index(requests.eos) + 1 if requests.eos in row else len(row) for row in new]

    yield generate


@contextmanager
def continuous_batching(model: Any, tokenizer: Any, requests: Requests, graphs: bool = False) -> Iterator[Generate]:
    """transformers' continuous batching: one manager (its thread started once, its paged cache
    sized here for every row at once), the requests added together, each result awaited."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    page = 32
    pages_per_row = -(-(len(requests.prompts[0]) + requests.max_new_tokens) // page)
    cache = ContinuousBatchingConfig(
        page_size=page,
        num_blocks=len(requests.prompts) * pages_per_row + 1,
        max_batch_tokens=max(len(requests.prompts), min(8192, sum(map(len, requests.prompts)))),
        use_cuda_graph=graphs,
        return_logprobs=True,
        seed=requests.seed,
        auto_switch_to_flash=False,  # the GPU box has no flash-attn build: sdpa, as the engine
    )
    manager = model.init_continuous_batching(_sampling(requests, requests.max_new_tokens), cache)
    manager.start()

    def generate(new_tokens: int) -> list[int]:
        ids = manager.add_requests([list(p) for p in requests.prompts], max_new_tokens=new_tokens)
        lengths: dict[str, int] = {}
        while len(lengths) < len(ids):
            out = manager.get_result(timeout=RESULT_TIMEOUT_S)
            if out is None:
                raise TimeoutError(f"no result within {RESULT_TIMEOUT_S} s ({len(lengths)} of {len(ids)} done)")
            if out.error:
                raise RuntimeError(f"request {out.request_id} failed: {out.error}")
            lengths[out.request_id] = len(out.generated_tokens)
        return list(lengths.values())

    try:
        yield generate
    finally:
        manager.stop(block=True, timeout=RESULT_TIMEOUT_S)


def _sampling(requests: Requests, new_tokens: int) -> Any:
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        min_new_tokens=0,
        eos_token_id=requests.eos,
        pad_token_id=requests.pad,
    )


RUNNERS: dict[str, Callable[..., Any]] = {
    "engine": engine,
    "static": static_cache,
    "cb": continuous_batching,
    "cb_graphs": lambda model, tokenizer, requests: continuous_batching(model, tokenizer, requests, graphs=True),
}
