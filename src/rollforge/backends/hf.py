"""Hugging Face transformers backend: continuous batching of concurrent requests on one worker thread.

Design (the loop is ``HFBackend._run``):

- ``generate`` may be awaited by any number of episodes at any time. It puts a request on a
  thread-safe queue (``hf_inbox``) and awaits an asyncio future; the event loop never runs the model.
- One worker thread owns the model and a *running batch* (``hf_batch.RunningBatch``): every active
  row lives in one KV cache, left-padded to a common length, with a (B, L) attention mask, an
  explicit next position per row, and per-row sampling parameters held as tensors.
- The worker alternates two things. (1) Admission: requests that arrived since the last step are
  prefilled together in one left-padded forward pass (``logits_to_keep=1``; identical prompts, such
  as a GRPO group's, are computed once and copied), sample their first token, and their cache is
  merged into the running one. A running batch never drains before
  others join; ``max_wait_ms`` only applies when the worker is idle, so that simultaneous arrivals
  share one prefill. (2) One decode step: one forward pass of one token per row. Finished rows then
  leave the batch, and pad columns that every remaining row has in common are trimmed.
- Sampling is batched, per row, from uniforms pre-drawn per request, so a request's samples do not
  depend on which requests share its batch (``sampling``). The stored logprob of a token is that of
  the raw logits, before temperature and filters.
- Cost per step: one host transfer of (B,) tokens and (B,) logprobs and O(B) Python, independent of
  sequence length (stop strings decode a short trailing window). The tensor-side savings live next
  to what they speed up: cache columns written in place (``hf_batch.SlackLayer``), top-p over a
  window of the top logits (``sampling``), fused grouped-query attention and the release of the
  event-loop thread's idle OpenMP threads on CPU (``cpu_speedups``).
- Failures: an invalid request (empty, too long for the model, unknown token ids) or a failing
  prefill fails only its own requests. Any other error in the worker fails every pending request
  with ``BackendError`` and the backend then refuses new ones; nothing waits forever. Results and
  errors go back with ``loop.call_soon_threadsafe``.

Device and precision: the worker builds every tensor on the model's device; ``compute_dtype``
(bfloat16 on the trainer's float32 master weights) runs it under ``torch.autocast``, as the update.

Only models whose cache is plain full attention (Llama, Qwen2, Mistral without sliding window, ...)
are supported; others are rejected at construction.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import random
import threading
import time
import weakref
from dataclasses import fields
from typing import Any, Sequence

import torch

from ..arguments import check_model, check_tokenizer
from ..errors import BackendError, ContextExceeded
from ..types import Completion
from .base import Backend, SamplingParams, StopStrings
from .cpu_speedups import FAST_GQA_ATTENTION, can_switch_to_fast_gqa, release_idle_openmp_threads
from .hf_batch import BackendStats, Request, Row, RunningBatch, check_cache_support, prefill_key, prompt_problem
from .hf_inbox import FORGET_PREFIXES, SHUTDOWN, drain_requests, stop_worker
from .hf_prefix import PrefixStore
from .sampling import RowSampling, filtered_probs, sample
from .settings import HFSettings

# RowSampling, filtered_probs and sample are re-exported: callers import them from here.
__all__ = [
    "BackendStats",
    "FAST_GQA_ATTENTION",
    "HFBackend",
    "RowSampling",
    "filtered_probs",
    "release_idle_openmp_threads",
    "sample",
]

logger = logging.getLogger(__name__)


class HFBackend(Backend):
    """Continuous-batching generation with a transformers causal LM (see the module docstring).

    ``settings`` (``HFSettings``): the batch size, how long an idle worker waits for company, the
    prefill bound, threads, the seed of requests without one, the CPU speed-ups, the prefix cache
    and the compute precision. After changing the weights in place, call ``invalidate_cache()``.

    Call ``close()`` when done: the worker holds the model until then (or until interpreter exit).
    """

    def __init__(self, model: Any, tokenizer: Any, settings: HFSettings = HFSettings()):
        check_model(model, "HFBackend")
        check_tokenizer(tokenizer, "HFBackend", needs=("decode", "eos_token_id", "pad_token_id"))
        check_cache_support(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.settings = settings
        self.max_batch_size = settings.max_batch_size
        self.max_wait_ms = settings.max_wait_ms
        self.max_prefill_tokens = settings.max_prefill_tokens
        self._num_threads = settings.num_threads
        self._device = next(model.parameters()).device
        weights_dtype = next(model.parameters()).dtype
        compute_dtype = settings.compute_dtype
        self._autocast = compute_dtype if compute_dtype not in (None, weights_dtype) else None
        config = model.config.get_text_config(decoder=True)
        self._max_positions: int | None = getattr(config, "max_position_embeddings", None)
        self._vocab_size: int = model.get_input_embeddings().num_embeddings
        self._eos_ids = _eos_ids(tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._seeds = random.Random(settings.seed)
        self._prefixes = PrefixStore(int(settings.prefix_cache_mb * 2**20))  # worker-owned
        self._release_openmp = settings.release_openmp and self._device.type == "cpu"
        self._switched_attention = settings.fast_gqa and can_switch_to_fast_gqa(model, self._device)
        if self._switched_attention:
            model.set_attn_implementation(FAST_GQA_ATTENTION)

        self._queue: queue.Queue = queue.Queue()
        self._waiting: collections.deque[Request] = collections.deque()  # worker-owned
        self._batch: RunningBatch | None = None  # worker-owned
        # Every key exists from the start, so ``stats`` can copy the dict while the worker counts.
        self._counts = {f.name: 0 for f in fields(BackendStats)}
        self._lock = threading.Lock()  # guards _failure/_closed against a racing enqueue
        self._failure: BackendError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rollforge-hf-backend", daemon=True)
        self._thread.start()
        # A daemon thread still inside torch when the interpreter finalizes aborts the process
        # ("terminate called without an active exception"): an unclosed backend stops at exit.
        self._stop_at_exit = weakref.finalize(self, stop_worker, self._queue, self._thread)

    # --- public face -------------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        loop = asyncio.get_running_loop()
        request = Request(tuple(map(int, prompt_ids)), params, loop.create_future(), loop)
        if self._release_openmp:
            release_idle_openmp_threads()
        with self._lock:
            if self._failure is not None:
                raise BackendError(str(self._failure)) from self._failure.__cause__
            if self._closed:
                raise BackendError("the HF backend is closed")
            self._queue.put(request)
        return await request.future

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            self._queue.put(SHUTDOWN)
        self._stop_at_exit.detach()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        if self._switched_attention and self.model.config._attn_implementation == FAST_GQA_ATTENTION:
            self.model.set_attn_implementation("sdpa")
        self._switched_attention = False

    def shares_model(self, model: Any) -> bool:
        return self.model is model

    def invalidate_cache(self) -> None:
        """The model's weights changed in place (a training step): stored prefix caches are stale.
        Requests enqueued after this call never reuse a cache computed before it."""
        self._queue.put(FORGET_PREFIXES)

    @property
    def stats(self) -> BackendStats:
        return BackendStats(**dict(self._counts))

    # --- worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._num_threads is not None:
            torch.set_num_threads(self._num_threads)
        try:
            mixed = torch.autocast(self._device.type, self._autocast) if self._autocast else contextlib.nullcontext()
            with torch.inference_mode(), mixed:
                while self._admit():
                    if self._batch is not None:
                        self._decode_step()
            closed = BackendError("the HF backend was closed before the request finished")
            self._fail_everything(closed, crashed=False)
        except BaseException as exc:  # every waiter must learn about the crash
            logger.exception("HF backend worker crashed")
            error = BackendError(f"the HF backend worker crashed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            self._fail_everything(error, crashed=True)

    def _admit(self) -> bool:
        """Prefill new arrivals and merge them into the running batch. False on shutdown."""
        if not self._collect(block=self._batch is None and not self._waiting):
            return False
        room = self.max_batch_size - (len(self._batch) if self._batch else 0)
        admitted: list[Row] = []
        width = 0  # longest admitted prompt: the prefill is (len(admitted), width) tokens
        while self._waiting and len(admitted) < room:
            request = self._waiting[0]
            longer = max(width, len(request.prompt_ids))
            if admitted and (len(admitted) + 1) * longer > self.max_prefill_tokens:
                break  # the rest joins after the next decode step
            self._waiting.popleft()
            if request.future.done():  # cancelled while waiting
                continue
            row = self._make_row(request)
            if row is not None:
                admitted.append(row)
                width = longer
        if admitted:
            self._prefill(admitted)
        return True

    def _collect(self, block: bool) -> bool:
        """Move queued requests to ``_waiting``; when ``block``, wait for the first one and then up
        to ``max_wait_ms`` for company. False when the shutdown sentinel arrives."""
        if block:
            while not self._waiting:
                if not self._receive(self._queue.get()):
                    return False
            deadline = time.monotonic() + self.max_wait_ms / 1000
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
                if not self._receive(item):
                    return False
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if not self._receive(item):
                return False

    def _receive(self, item: Any) -> bool:
        """Handle one queue item in order; False for the shutdown sentinel."""
        if item is SHUTDOWN:
            return False
        if item is FORGET_PREFIXES:
            self._prefixes.clear()
        else:
            self._waiting.append(item)
        return True

    def _make_row(self, request: Request) -> Row | None:
        """Validate a request; fail it alone (and return None) when it cannot run."""
        problem = prompt_problem(request.prompt_ids, self._max_positions, self._vocab_size)
        if problem is not None:
            too_long = self._max_positions is not None and len(request.prompt_ids) >= self._max_positions
            self._fail(request, (ContextExceeded if too_long else BackendError)(problem))
            return None
        params = request.params
        budget = params.max_new_tokens
        if self._max_positions is not None:
            budget = min(budget, self._max_positions - len(request.prompt_ids))
        stop_ids = frozenset(params.stop_token_ids) if params.stop_token_ids else self._eos_ids
        stop_strings = StopStrings(self.tokenizer.decode, params.stop)
        prefix = self._prefixes.take(request.prompt_ids)
        if prefix is not None:
            self._counts["prefix_hits"] += 1
            self._counts["prefix_tokens_reused"] += len(prefix.ids)
        return Row(request, budget, stop_ids, stop_strings, prefix=prefix)

    def _prefill(self, rows: list[Row]) -> None:
        """One left-padded forward pass over the new prompts; their first tokens; join the batch."""
        try:
            batch, logits = RunningBatch.prefill(self.model, rows, self._pad_id, self._seeds, self._device)
        except Exception as exc:  # a failing prefill fails only its own requests
            if len(rows) > 1:  # find the culprit: each request alone
                for row in rows:
                    self._prefill([row])
                return
            logger.warning("prefill failed: %s", exc)
            self._fail(rows[0].request, BackendError(f"prefill failed: {type(exc).__name__}: {exc}"))
            return
        self._counts["prefill_passes"] += 1
        self._counts["prefill_rows"] += len(rows)
        self._counts["prefill_shared"] += len(rows) - len({prefill_key(row) for row in rows})
        tokens, logprobs = sample(logits, batch.uniforms[:, 0], batch.sampling)
        batch.last = tokens
        batch.steps += 1
        batch = self._accept(batch, tokens, logprobs)
        if batch is None:
            return
        if self._batch is None:
            self._batch = batch
        else:
            self._batch.extend(batch)
            self._counts["joins"] += 1
        self._counts["max_running"] = max(self._counts["max_running"], len(self._batch))

    def _decode_step(self) -> None:
        """One token for every running row."""
        batch = self._batch
        logits = batch.decode(self.model)  # (B, V)
        self._counts["decode_steps"] += 1
        self._counts["decode_rows"] += len(batch)
        uniforms = batch.uniforms.gather(1, batch.steps[:, None]).squeeze(1)  # (B,)
        tokens, logprobs = sample(logits, uniforms, batch.sampling)
        batch.positions += 1
        batch.steps += 1
        batch.last = tokens
        self._batch = self._accept(batch, tokens, logprobs)

    def _accept(self, batch: RunningBatch, tokens: torch.Tensor, logprobs: torch.Tensor) -> RunningBatch | None:
        """Hand each row its token; answer and drop the rows that finished (or were cancelled).
        Return the batch of the rows that go on, or None when none does."""
        host = torch.stack([tokens.double(), logprobs.double()]).tolist()  # one transfer
        keep: list[int] = []
        for i, (row, token, logprob) in enumerate(zip(batch.rows, host[0], host[1])):
            if row.request.future.done():  # cancelled by the caller
                continue
            reason = row.accept(int(token), logprob)
            if reason is None:
                keep.append(i)
                continue
            self._counts["completed"] += 1
            self._counts["generated_tokens"] += len(row.token_ids)
            row.request.settle(row.completion(reason))
            if self._prefixes.max_bytes > 0:
                stored = batch.row_prefix(i)
                if stored is not None:
                    self._prefixes.put(stored)
        if not keep:
            return None
        if len(keep) < len(batch):
            batch.select(keep)
        return batch

    # --- failures ----------------------------------------------------------------------------

    def _fail(self, request: Request, error: BackendError) -> None:
        self._counts["failed"] += 1
        request.settle(error)

    def _fail_everything(self, error: BackendError, crashed: bool) -> None:
        """Fail every pending request; from now on ``generate`` raises at once."""
        with self._lock:
            if crashed:
                self._failure = error
            self._closed = True
        pending = list(self._waiting)
        self._waiting.clear()
        if self._batch is not None:
            pending += [row.request for row in self._batch.rows]
            self._batch = None
        pending += drain_requests(self._queue)
        for request in pending:
            self._fail(request, error)


def _eos_ids(tokenizer: Any) -> frozenset[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
