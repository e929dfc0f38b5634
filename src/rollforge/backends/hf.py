"""Hugging Face transformers backend: continuous batching of concurrent requests on one worker thread.

Design (the loop is ``HFBackend._run``):

- ``generate`` may be awaited by any number of episodes at any time. It puts a request on a
  thread-safe queue and awaits an asyncio future; the event loop never runs the model.
- One worker thread owns the model and a *running batch*: every active row lives in one KV cache,
  left-padded to a common length, with a (B, L) attention mask, an explicit next position per row,
  and per-row sampling parameters held as tensors.
- The worker alternates two things. (1) Admission: requests that arrived since the last step are
  prefilled together in one left-padded forward pass (``logits_to_keep=1``), sample their first
  token, and their cache is merged into the running one (the shorter side is left-padded per
  layer). A running batch never drains before others join; ``max_wait_ms`` only applies when the
  worker is idle, so that simultaneous arrivals share one prefill. (2) One decode step: one forward
  pass of one token per row. Finished rows then leave the batch, and pad columns that every
  remaining row has in common are trimmed.
- Sampling is batched, per row: greedy rows take the argmax; the others apply temperature, top-k
  and top-p and draw by inverse CDF over the vocabulary in id order, with uniforms pre-drawn per
  request from a ``torch.Generator`` seeded by ``params.seed`` (or by the backend's seeded RNG): a
  request's samples do not depend on which requests share its batch (up to float noise). The stored
  logprob of a token is ``log_softmax`` of the raw float32 logits, before temperature and filters.
- Cost per step: one host transfer of (B,) tokens and (B,) logprobs and O(B) Python, independent of
  sequence length (stop strings decode a short trailing window). On the tensor side, the KV cache
  writes each new column in place (``_SlackLayer``) instead of re-concatenating, and on CPU grouped
  -query attention with a padding mask runs fused (``FAST_GQA_ATTENTION``) instead of materialising
  repeated keys and values; top-p ranks a window of the top logits instead of sorting the
  vocabulary; and the event-loop thread's idle OpenMP threads are released so that libgomp does
  not throttle the worker's (``release_idle_openmp_threads``).
- Failures: an invalid request (empty, too long for the model, unknown token ids) or a failing
  prefill fails only its own requests. Any other error in the worker fails every pending request
  with ``BackendError`` and the backend then refuses new ones; nothing waits forever. Results and
  errors go back with ``loop.call_soon_threadsafe``.

Only models whose cache is plain full attention (Llama, Qwen2, Mistral without sliding window, ...)
are supported; others are rejected at construction.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import functools
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface, DynamicCache
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from ..errors import BackendError, ConfigError
from ..types import Completion, FinishReason
from .base import SamplingParams, StopStrings

logger = logging.getLogger(__name__)

_SHUTDOWN = object()  # queue sentinel


@dataclass(frozen=True)
class BackendStats:
    """Counters of the work the backend did (a snapshot; read ``HFBackend.stats`` again to refresh)."""

    prefill_passes: int = 0  # forward passes over newly admitted prompts
    prefill_rows: int = 0  # prompts prefilled (sum of prefill batch sizes)
    joins: int = 0  # prefills whose rows joined a batch that was already decoding
    decode_steps: int = 0  # one-token forward passes of the running batch
    decode_rows: int = 0  # sum of the running batch size over decode steps
    max_running: int = 0  # largest running batch seen
    generated_tokens: int = 0
    completed: int = 0  # requests answered with a Completion
    failed: int = 0  # requests answered with a BackendError

    @property
    def forward_passes(self) -> int:
        return self.prefill_passes + self.decode_steps

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


class HFBackend:
    """Continuous-batching generation with a transformers causal LM (see the module docstring).

    - ``max_batch_size``: rows in the running batch at most; later arrivals wait.
    - ``max_wait_ms``: how long an idle worker waits after a first arrival for others to share
      its prefill.
    - ``max_prefill_tokens``: bound on one prefill pass (rows x longest prompt, padding included);
      a single longer prompt still runs, alone.
    - ``num_threads``: torch intra-op threads for the worker. By default the current setting is
      kept, which already honours ``OMP_NUM_THREADS`` and a user's ``torch.set_num_threads``.
    - ``seed``: seeds the generators of requests that carry no seed of their own.
    - ``fast_gqa``: while the backend is open, a CPU model with grouped-query attention runs the
      numerically identical ``FAST_GQA_ATTENTION`` instead of "sdpa" (``close`` switches it back).
    - ``release_openmp``: on CPU, ``generate`` releases the idle OpenMP threads of the calling
      (event-loop) thread; see ``release_idle_openmp_threads``.

    Call ``close()`` when done: the worker thread holds the model until then.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        max_wait_ms: float = 2.0,
        max_prefill_tokens: int = 16384,
        num_threads: int | None = None,
        seed: int | None = None,
        fast_gqa: bool = True,
        release_openmp: bool = True,
    ):
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        if max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        if num_threads is not None and num_threads < 1:
            raise ConfigError(f"num_threads must be >= 1 or None, got {num_threads}")
        _check_cache_support(model)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.max_prefill_tokens = max_prefill_tokens
        self._num_threads = num_threads
        self._device = next(model.parameters()).device
        config = model.config.get_text_config(decoder=True)
        self._max_positions: int | None = getattr(config, "max_position_embeddings", None)
        self._vocab_size: int = model.get_input_embeddings().num_embeddings
        self._eos_ids = _eos_ids(tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._seeds = random.Random(seed)
        self._release_openmp = release_openmp and self._device.type == "cpu"
        self._switched_attention = fast_gqa and _can_switch_to_fast_gqa(model, self._device)
        if self._switched_attention:
            model.set_attn_implementation(FAST_GQA_ATTENTION)

        self._queue: queue.Queue = queue.Queue()
        self._waiting: collections.deque[_Request] = collections.deque()  # worker-owned
        self._batch: _Batch | None = None  # worker-owned
        # Every key exists from the start, so ``stats`` can copy the dict while the worker counts.
        self._counts = {f.name: 0 for f in fields(BackendStats)}
        self._lock = threading.Lock()  # guards _failure/_closed against a racing enqueue
        self._failure: BackendError | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rollforge-hf-backend", daemon=True)
        self._thread.start()

    # --- public face -------------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        loop = asyncio.get_running_loop()
        request = _Request(tuple(map(int, prompt_ids)), params, loop.create_future(), loop)
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
            self._queue.put(_SHUTDOWN)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        if self._switched_attention and self.model.config._attn_implementation == FAST_GQA_ATTENTION:
            self.model.set_attn_implementation("sdpa")
        self._switched_attention = False

    @property
    def stats(self) -> BackendStats:
        return BackendStats(**dict(self._counts))

    # --- worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._num_threads is not None:
            torch.set_num_threads(self._num_threads)
        try:
            with torch.inference_mode():
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
        admitted: list[_Row] = []
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
            item = self._queue.get()
            if item is _SHUTDOWN:
                return False
            self._waiting.append(item)
            deadline = time.monotonic() + self.max_wait_ms / 1000
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
                if item is _SHUTDOWN:
                    return False
                self._waiting.append(item)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return True
            if item is _SHUTDOWN:
                return False
            self._waiting.append(item)

    def _make_row(self, request: _Request) -> _Row | None:
        """Validate a request; fail it alone (and return None) when it cannot run."""
        problem = self._check_prompt(request.prompt_ids)
        if problem is not None:
            self._fail(request, BackendError(problem))
            return None
        params = request.params
        budget = params.max_new_tokens
        if self._max_positions is not None:
            budget = min(budget, self._max_positions - len(request.prompt_ids))
        stop_ids = frozenset(params.stop_token_ids) if params.stop_token_ids else self._eos_ids
        stop_strings = StopStrings(self.tokenizer.decode, params.stop)
        return _Row(request, budget, stop_ids, stop_strings)

    def _check_prompt(self, prompt: tuple[int, ...]) -> str | None:
        if not prompt:
            return "the prompt is empty; a request needs at least one prompt token"
        if self._max_positions is not None and len(prompt) >= self._max_positions:
            return (
                f"the prompt has {len(prompt)} tokens but the model handles at most "
                f"{self._max_positions} positions (prompt plus at least one new token)"
            )
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= self._vocab_size:
            bad = low if low < 0 else high
            return (
                f"the prompt contains token id {bad}, outside the model's vocabulary "
                f"[0, {self._vocab_size})"
            )
        return None

    def _prefill(self, rows: list[_Row]) -> None:
        """One left-padded forward pass over the new prompts; their first tokens; join the batch."""
        try:
            batch, logits = self._forward_prompts(rows)
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

    def _forward_prompts(self, rows: list[_Row]) -> tuple[_Batch, torch.Tensor]:
        prompts = [row.request.prompt_ids for row in rows]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([(self._pad_id,) * (width - len(p)) + p for p in prompts], device=self._device)
        mask = torch.tensor(
            [[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=self._device
        )  # (B, T)
        positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
        cache = Cache(layer_class_to_replicate=_SlackLayer)
        padded = any(len(p) < width for p in prompts)
        out = self.model(
            input_ids=ids,
            attention_mask=mask if padded else None,  # None: the causal fast path
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        batch = _Batch(
            rows=rows,
            cache=cache,
            mask=mask,
            positions=torch.tensor([len(p) for p in prompts], device=self._device),
            last=ids[:, -1],
            steps=torch.zeros(len(rows), dtype=torch.long, device=self._device),
            uniforms=self._draw_uniforms(rows),
        )
        return batch, out.logits[:, -1]  # (B, V)

    def _draw_uniforms(self, rows: list[_Row]) -> torch.Tensor:
        """(B, max budget) uniforms: row i's sampler uses column t for its t-th token."""
        width = max(row.budget for row in rows)
        uniforms = torch.zeros(len(rows), width)
        for i, row in enumerate(rows):
            params = row.request.params
            if params.greedy:
                continue
            seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
            generator = torch.Generator().manual_seed(seed)
            uniforms[i, : row.budget] = torch.rand(row.budget, generator=generator)
        return uniforms.to(self._device)

    def _decode_step(self) -> None:
        """One token for every running row."""
        batch = self._batch
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch), 1)], dim=1)  # (B, L+1)
        out = self.model(
            input_ids=batch.last[:, None],
            attention_mask=batch.mask if batch.padded else None,  # None: no mask to build or apply
            position_ids=batch.positions[:, None],
            past_key_values=batch.cache,
            use_cache=True,
        )
        self._counts["decode_steps"] += 1
        self._counts["decode_rows"] += len(batch)
        uniforms = batch.uniforms.gather(1, batch.steps[:, None]).squeeze(1)  # (B,)
        tokens, logprobs = sample(out.logits[:, -1], uniforms, batch.sampling)
        batch.positions += 1
        batch.steps += 1
        batch.last = tokens
        self._batch = self._accept(batch, tokens, logprobs)

    def _accept(self, batch: _Batch, tokens: torch.Tensor, logprobs: torch.Tensor) -> _Batch | None:
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
        if not keep:
            return None
        if len(keep) < len(batch):
            batch.select(keep)
        return batch

    # --- failures ----------------------------------------------------------------------------

    def _fail(self, request: _Request, error: BackendError) -> None:
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
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _SHUTDOWN:
                pending.append(item)
        for request in pending:
            self._fail(request, error)


# --- request state --------------------------------------------------------------------------------


@dataclass(eq=False)
class _Request:
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop

    def settle(self, outcome: Completion | BaseException) -> None:
        """Hand the outcome to the awaiting coroutine from any thread."""

        def _set() -> None:
            if self.future.done():  # cancelled by the caller meanwhile
                return
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:
            # The caller's event loop is closed: nobody awaits this request any more.
            logger.debug("dropping the result of a request whose event loop is closed")


@dataclass(eq=False)
class _Row:
    """One request inside the running batch: its stop rules and the tokens generated so far."""

    request: _Request
    budget: int  # tokens it may generate in all: max_new_tokens, capped by the model positions
    stop_ids: frozenset[int]
    stop_strings: StopStrings
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def accept(self, token: int, logprob: float) -> FinishReason | None:
        """Append one sampled token; return the finish reason if the row is done."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if token in self.stop_ids or self.stop_strings.completed_by_last(self.token_ids):
            return "stop"
        if len(self.token_ids) >= self.budget:
            return "length"
        return None

    def completion(self, reason: FinishReason) -> Completion:
        return Completion(tuple(self.token_ids), tuple(self.logprobs), reason)


@dataclass(eq=False)
class _Batch:
    """Rows that decode together. Row ``i`` of every tensor belongs to ``rows[i]``."""

    rows: list[_Row]
    cache: Cache  # per layer keys/values (B, H_kv, L, D), left-padded, in _SlackLayer buffers
    mask: torch.Tensor  # (B, L) bool, False on padding
    positions: torch.Tensor  # (B,) position of the next input token
    last: torch.Tensor  # (B,) the next input token (the last sampled one)
    steps: torch.Tensor  # (B,) tokens generated so far: index of the next uniform
    uniforms: torch.Tensor  # (B, U) pre-drawn uniforms of each row's sampler
    sampling: RowSampling = field(init=False)
    padded: bool = field(init=False)  # some row has padding: the model needs the mask

    def __post_init__(self) -> None:
        self._refresh()

    def __len__(self) -> int:
        return len(self.rows)

    def select(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (in order), then trim pad columns they all share."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in keep]
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).int().argmax())  # first column some row attends to
        self.mask = mask[:, start:]
        self.cache = _make_cache(
            (k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
            for k, v in _cache_tensors(self.cache)
        )
        self.positions = self.positions.index_select(0, index)
        self.last = self.last.index_select(0, index)
        self.steps = self.steps.index_select(0, index)
        self.uniforms = self.uniforms.index_select(0, index)
        self._refresh()

    def extend(self, other: _Batch) -> None:
        """Append the rows of ``other``; the shorter cache and mask are left-padded to match."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        self.rows = self.rows + other.rows
        self.mask = torch.cat([_pad_left(self.mask, length, dim=1), _pad_left(other.mask, length, dim=1)])
        self.cache = _make_cache(
            (
                torch.cat([_pad_left(k1, length, dim=2), _pad_left(k2, length, dim=2)]),
                torch.cat([_pad_left(v1, length, dim=2), _pad_left(v2, length, dim=2)]),
            )
            for (k1, v1), (k2, v2) in zip(_cache_tensors(self.cache), _cache_tensors(other.cache))
        )
        self.positions = torch.cat([self.positions, other.positions])
        self.last = torch.cat([self.last, other.last])
        self.steps = torch.cat([self.steps, other.steps])
        width = max(self.uniforms.shape[1], other.uniforms.shape[1])
        self.uniforms = torch.cat([_pad_right(self.uniforms, width), _pad_right(other.uniforms, width)])
        self._refresh()

    def _refresh(self) -> None:
        """Recompute what depends only on the batch's composition (not on each step)."""
        self.sampling = RowSampling.for_rows(self.rows, self.mask.device)
        self.padded = not bool(self.mask.all())


# --- sampling -------------------------------------------------------------------------------------


_TOP_P_WINDOW = 256  # logits ranked first when a row uses top-p (see _filter_cutoff)

@dataclass(frozen=True)
class RowSampling:
    """Per-row sampling parameters as (B,) tensors, plus flags that let a step skip unused work."""

    greedy: torch.Tensor  # (B,) bool
    temperature: torch.Tensor  # (B,) float32, 1 for greedy rows
    top_p: torch.Tensor  # (B,) float32
    top_k: torch.Tensor  # (B,) int64, 0 = off
    any_sampled: bool
    any_top_p: bool
    max_top_k: int  # 0 when no row uses top-k

    @classmethod
    def for_rows(cls, rows: Sequence[_Row], device: torch.device) -> RowSampling:
        return cls.from_params([row.request.params for row in rows], device)

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu"
    ) -> RowSampling:
        greedy = [p.greedy for p in params]
        return cls(
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            temperature=torch.tensor(
                [1.0 if g else p.temperature for g, p in zip(greedy, params)], device=device
            ),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            any_sampled=not all(greedy),
            any_top_p=any(p.top_p < 1 and not g for g, p in zip(greedy, params)),
            max_top_k=max((p.top_k for g, p in zip(greedy, params) if not g), default=0),
        )


def sample(
    logits: torch.Tensor, uniforms: torch.Tensor, sampling: RowSampling
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row from logits (B, V) with uniforms (B,); return tokens (B,) and their
    logprobs (B,) under the raw distribution."""
    logits = logits.float()  # (B, V)
    tokens = logits.argmax(dim=-1)  # (B,)
    if sampling.any_sampled:
        # The draw walks the vocabulary in id order whatever filters the other rows use, so a row's
        # token depends only on its own logits, parameters and uniform.
        drawn = _inverse_cdf(filtered_probs(logits / sampling.temperature[:, None], sampling), uniforms)
        tokens = torch.where(sampling.greedy, tokens, drawn)
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return tokens, logprobs


def filtered_probs(scaled: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    """softmax(scaled) with the tokens that top-k, then top-p, remove set to 0 (not renormalised).
    ``scaled``: temperature-scaled logits (B, V), in vocabulary order."""
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    if sampling.any_top_p or sampling.max_top_k:
        cutoff = _filter_cutoff(scaled, sampling)  # (B,)
        probs = probs.masked_fill(scaled < cutoff[:, None], 0.0)
    return probs


def _filter_cutoff(scaled: torch.Tensor, sampling: RowSampling) -> torch.Tensor:
    """Per row, the smallest scaled logit that survives top-k then top-p (-inf: no filter).

    Only the largest ``width`` logits are ranked (``topk``): a full sort of a 50k vocabulary costs
    as much as a forward pass on CPU. The window starts at max(top_k, 256) and grows only while a
    top-p row's nucleus might extend past it."""
    vocab = scaled.shape[1]
    width = min(vocab, max(sampling.max_top_k, _TOP_P_WINDOW if sampling.any_top_p else 0))
    k = torch.where(sampling.top_k > 0, sampling.top_k, vocab)  # (B,)
    while True:
        values = scaled.topk(width, dim=-1).values  # (B, W), descending
        kept = k.clamp(max=width)
        if not sampling.any_top_p:
            break
        kept, covered = _top_p_kept(scaled, values, k, kept, sampling.top_p)
        if covered or width == vocab:
            break
        width = min(vocab, width * 4)
    cutoff = values.gather(1, (kept - 1)[:, None]).squeeze(1)  # (B,)
    filtered = (sampling.top_k > 0) | (sampling.top_p < 1)
    return torch.where(filtered, cutoff, torch.full_like(cutoff, float("-inf")))


def _top_p_kept(
    scaled: torch.Tensor, values: torch.Tensor, k: torch.Tensor, kept: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, bool]:
    """How many of the top ``values`` the nucleus keeps, and whether the window held every nucleus.

    Probabilities are those of the top-k distribution: normalised over the first k values (top_k
    rows, whose top-k set fits the window) or over the whole vocabulary. A token is dropped once the
    mass before it reaches top_p; rows with top_p == 1 are exempt (round-off could drop their tail).
    """
    width = values.shape[1]
    in_top_k = torch.arange(width, device=values.device)[None, :] < kept[:, None]  # (B, W)
    windowed = values.masked_fill(~in_top_k, float("-inf"))
    normaliser = torch.where(k <= width, windowed.logsumexp(dim=-1), scaled.logsumexp(dim=-1))  # (B,)
    probs = (windowed - normaliser[:, None]).exp()  # (B, W)
    mass = probs.cumsum(dim=-1)
    threshold = torch.where(top_p < 1, top_p, torch.inf)
    nucleus = ((mass - probs) < threshold[:, None]).sum(dim=-1)  # (B,), >= 1
    # A nucleus that fills the window without reaching top_p may continue past it.
    spills = (top_p < 1) & (k > width) & (mass[:, -1] < threshold)
    return torch.minimum(kept, nucleus), not bool(spills.any())


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index i with cdf[i-1] <= u * total < cdf[i]; never a zero-probability entry. (B, K) -> (B,)."""
    cdf = probs.cumsum(dim=-1)  # (B, K)
    total = cdf[:, -1]
    target = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)


# --- KV cache and attention -----------------------------------------------------------------------


class _SlackLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values are views into buffers with spare columns at the end.

    ``DynamicLayer`` concatenates the whole cache with the new column at every decode step, which
    copies O(B * L) per layer per step; here a step writes one column in place, and a buffer is only
    reallocated (with ``slack`` spare columns, or a quarter more) when it is full. Anything that
    replaced ``keys``/``values`` from outside is absorbed at the next update.
    """

    slack = 64

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor) -> _SlackLayer:
        layer = cls()
        layer.update(keys, values)
        return layer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2] if self.keys.dim() == 4 else 0
        end = start + key_states.shape[-2]
        in_buffer = self._key_buffer is not None and self.keys._base is self._key_buffer
        if not in_buffer or end > self._key_buffer.shape[-2]:
            self._reallocate(key_states, value_states, start, capacity=end + max(self.slack, end // 4))
        self._key_buffer[:, :, start:end] = key_states
        self._value_buffer[:, :, start:end] = value_states
        self.keys = self._key_buffer[:, :, :end]
        self.values = self._value_buffer[:, :, :end]
        return self.keys, self.values

    def _reallocate(
        self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int
    ) -> None:
        """New buffers of ``capacity`` columns holding the first ``length`` columns of the cache."""
        batch, heads = key_states.shape[:2]
        keys = key_states.new_empty(batch, heads, capacity, key_states.shape[-1])
        values = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if length:
            keys[:, :, :length] = self.keys
            values[:, :, :length] = self.values
        self._key_buffer, self._value_buffer = keys, values


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
    if attention_mask is None or not grouped or not plain or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, H, T, D)
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(FAST_GQA_ATTENTION, _sdpa_gqa_attention)
AttentionMaskInterface.register(FAST_GQA_ATTENTION, sdpa_mask)


def _check_cache_support(model: Any) -> None:
    layers = DynamicCache(config=model.config).layers
    unsupported = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if unsupported:
        raise ConfigError(
            f"HFBackend batches full-attention KV caches only; {type(model).__name__} uses {unsupported}"
        )


def _can_switch_to_fast_gqa(model: Any, device: torch.device) -> bool:
    config = model.config.get_text_config(decoder=True)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    grouped = heads is not None and kv_heads < heads
    return device.type == "cpu" and grouped and model.config._attn_implementation == "sdpa"


def _cache_tensors(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _make_cache(tensors: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Cache:
    return Cache(layers=[_SlackLayer.holding(keys, values) for keys, values in tensors])


def _pad_left(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    """Zero/False-pad ``tensor`` on the left of ``dim`` up to ``length``."""
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def _pad_right(tensor: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(tensor, (0, width - tensor.shape[1])) if tensor.shape[1] < width else tensor


# --- OpenMP --------------------------------------------------------------------------------------


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


# --- helpers --------------------------------------------------------------------------------------


def _eos_ids(tokenizer: Any) -> frozenset[int]:
    eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
