"""The vLLM-facing pieces of ``VLLMBackend`` that hold no backend state.

Design: ``engine_args`` turns the backend's ``VLLMSettings`` into ``vllm.AsyncEngineArgs``
fields (raw logprobs, prefix caching, rollforge's worker extension; ``engine_kwargs`` override
the rest); ``vllm_sampling_params`` and ``completion_from_output`` translate one request and its
result; ``LoopThread`` is the private event loop the engine lives on. vLLM itself is imported only
inside the functions that need it, so importing this module costs nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Coroutine

from ..errors import BackendError
from ..types import FINISH_REASONS, Completion
from .base import SamplingParams
from .settings import VLLMSettings
from .vllm_worker import WORKER_EXTENSION


def engine_args(model: str, settings: VLLMSettings) -> dict[str, Any]:
    """The ``vllm.AsyncEngineArgs`` fields for ``VLLMBackend``'s ``settings`` (checked when the
    settings were built)."""
    args: dict[str, Any] = dict(
        model=model,
        dtype=settings.dtype,
        seed=0 if settings.seed is None else settings.seed,
        max_num_seqs=settings.max_num_seqs,
        max_model_len=settings.max_model_len,
        logprobs_mode="raw_logprobs",
        enable_prefix_caching=True,
        enable_lora=settings.enable_lora,
        disable_log_stats=True,
        enforce_eager=default_enforce_eager() if settings.enforce_eager is None else settings.enforce_eager,
        worker_extension_cls=WORKER_EXTENSION,
    )
    if settings.enable_lora:
        args["max_lora_rank"] = settings.max_lora_rank
    if settings.sleep_level is not None:
        args["enable_sleep_mode"] = True
    if settings.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if settings.kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(settings.kv_cache_gib * 2**30)
    args.update(settings.engine_kwargs or {})
    return args


def sleep_mode_available() -> bool:
    """Whether the installed vLLM's platform has sleep mode (CUDA, ROCm; not the CPU build)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def default_enforce_eager() -> bool:
    """Eager mode on vLLM's CPU build, compiled elsewhere (see ``VLLMBackend``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def vllm_sampling_params(params: SamplingParams, seed: int) -> Any:
    """vLLM's ``SamplingParams`` for one request: one sample, the sampled token's logprob, stop
    strings kept in the output, special tokens kept in the text that stop strings are matched on."""
    import vllm
    from vllm.sampling_params import RequestOutputKind

    return vllm.SamplingParams(
        n=1,
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=seed,
        stop=list(params.stop) or None,
        stop_token_ids=[t for t in params.stop_token_ids if t >= 0],  # never sampled; vLLM rejects it
        include_stop_str_in_output=True,
        logprobs=0,
        detokenize=bool(params.stop),
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def completion_from_output(output: Any, request_id: str) -> Completion:
    """A ``Completion`` from a vLLM ``CompletionOutput`` requested with ``logprobs=0``."""
    ids = tuple(int(t) for t in output.token_ids)
    positions = output.logprobs
    if positions is None or len(positions) != len(ids):
        raise BackendError(
            f"vLLM request {request_id}: {len(ids)} tokens but "
            f"{'no' if positions is None else len(positions)} logprob positions"
        )
    try:
        logprobs = tuple(float(position[token].logprob) for position, token in zip(positions, ids))
    except (KeyError, TypeError) as exc:
        raise BackendError(f"vLLM request {request_id}: a sampled token has no logprob ({exc!r})") from exc
    reason = output.finish_reason if output.finish_reason in FINISH_REASONS else None
    if reason is None:
        raise BackendError(f"vLLM request {request_id} ended with finish reason {output.finish_reason!r}")
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=reason)


async def shutdown(engine: Any) -> None:
    engine.shutdown()


class LoopThread:
    """An event loop running forever on a daemon thread; coroutines are submitted to it."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, Any], timeout: float) -> Any:
        future = self.submit(coroutine)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
