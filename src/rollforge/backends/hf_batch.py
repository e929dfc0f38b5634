"""The HF backend worker's state: requests, their rows, and the running batch over one KV cache.

Design:

- ``BackendStats`` counts the worker's work for ``HFBackend.stats``.
- A ``Request`` is what ``generate`` enqueued; ``settle`` hands its outcome back to the awaiting
  event loop from the worker thread. A ``Row`` is a request admitted to the batch: its stop rules,
  budget and the tokens generated so far.
- A ``RunningBatch`` holds every active row in one KV cache, left-padded to a common length, with a
  (B, L) attention mask, the next position and input token per row, and the pre-drawn uniforms of
  each row's sampler. It runs the model's two forward passes: ``prefill`` (one left-padded pass
  over new prompts, which starts a batch) and ``decode`` (one token per row). ``extend`` merges
  newly prefilled rows (the shorter side is left-padded per layer); ``select`` drops finished rows
  and trims the pad columns the rest all share.
- The cache layers are ``SlackLayer``s: a decode step writes its column in place into a buffer
  with spare columns, instead of re-concatenating the whole cache as ``DynamicLayer`` does.
  Only models whose cache is plain full attention can be batched this way
  (``check_cache_support``); ``prompt_problem`` says why a request cannot run at all.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from ..errors import ConfigError
from ..types import Completion, FinishReason
from .base import SamplingParams, StopStrings
from .hf_prefix import CachedPrefix
from .sampling import RowSampling, draw_uniforms

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendStats:
    """Counters of the work the backend did (a snapshot; read ``HFBackend.stats`` again to refresh)."""

    prefill_passes: int = 0  # forward passes over newly admitted prompts
    prefill_rows: int = 0  # prompts prefilled (sum of prefill batch sizes)
    prefill_shared: int = 0  # of those, rows whose identical prompt was computed once for several rows
    joins: int = 0  # prefills whose rows joined a batch that was already decoding
    decode_steps: int = 0  # one-token forward passes of the running batch
    decode_rows: int = 0  # sum of the running batch size over decode steps
    max_running: int = 0  # largest running batch seen
    generated_tokens: int = 0
    completed: int = 0  # requests answered with a Completion
    failed: int = 0  # requests answered with a BackendError
    prefix_hits: int = 0  # requests that continued a finished request's stored cache
    prefix_tokens_reused: int = 0  # prompt tokens those requests did not prefill again

    @property
    def forward_passes(self) -> int:
        return self.prefill_passes + self.decode_steps

    @property
    def mean_decode_batch(self) -> float:
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


@dataclass(eq=False)
class Request:
    """One ``generate`` call, waiting on its event loop for the worker to ``settle`` it."""

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
class Row:
    """One request inside the running batch: its stop rules and the tokens generated so far."""

    request: Request
    budget: int  # tokens it may generate in all: max_new_tokens, capped by the model positions
    stop_ids: frozenset[int]
    stop_strings: StopStrings
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prefix: CachedPrefix | None = None  # a stored cache of the start of its prompt, to reuse

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
class RunningBatch:
    """Rows that decode together. Row ``i`` of every tensor belongs to ``rows[i]``."""

    rows: list[Row]
    cache: Cache  # per layer keys/values (B, H_kv, L, D), left-padded, in SlackLayer buffers
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

    @classmethod
    def prefill(
        cls, model: Any, rows: list[Row], pad_id: int, seeds: random.Random, device: torch.device
    ) -> tuple[RunningBatch, torch.Tensor]:
        """One left-padded forward pass over the rows' prompts (the last position's logits only).
        Return the batch holding their cache, with the uniforms of each row's sampler (``seeds``
        seeds the requests that carry no seed), and the logits (B, V) of their first tokens.

        Rows with the same prompt (the rollouts of one GRPO group) run it once: the pass covers the
        distinct prompts and its cache rows and logits are copied to the rows that share them."""
        prompts = [row.request.prompt_ids for row in rows]
        reused = [len(row.prefix.ids) if row.prefix is not None else 0 for row in rows]
        distinct: dict[tuple[tuple[int, ...], int], int] = {}
        source = [distinct.setdefault(prefill_key(row), len(distinct)) for row in rows]  # row -> pass row
        first = [source.index(j) for j in range(len(distinct))]  # pass row -> its first row
        held = max(reused)  # columns of stored cache in front of the new tokens
        news = [prompts[i][reused[i] :] for i in first]
        width = max(len(p) for p in news)
        ids = torch.tensor([(pad_id,) * (width - len(p)) + p for p in news], device=device)
        mask = torch.tensor(
            [
                [False] * (held - reused[i]) + [True] * reused[i] + [False] * (width - len(p)) + [True] * len(p)
                for p, i in zip(news, first)
            ],
            device=device,
        )  # (D, held + T): stored columns (left-padded), then the new tokens (left-padded)
        positions = torch.tensor(
            [[0] * (width - len(p)) + list(range(reused[i], reused[i] + len(p))) for p, i in zip(news, first)],
            device=device,
        )  # (D, T)
        cache = _stored_cache([rows[i] for i in first], held) if held else Cache(layer_class_to_replicate=SlackLayer)
        padded = bool(held) or any(len(p) < width for p in news)
        out = model(
            input_ids=ids,
            attention_mask=mask if padded else None,  # None: the causal fast path
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1]  # (D, V)
        if len(distinct) < len(rows):  # copy each pass row to the rows that share its prompt
            index = torch.tensor(source, device=device)
            cache = _make_cache((k.index_select(0, index), v.index_select(0, index)) for k, v in _cache_tensors(cache))
            ids, mask, logits = ids.index_select(0, index), mask.index_select(0, index), logits.index_select(0, index)
        batch = cls(
            rows=rows,
            cache=cache,
            mask=mask,
            positions=torch.tensor([len(p) for p in prompts], device=device),
            last=ids[:, -1],
            steps=torch.zeros(len(rows), dtype=torch.long, device=device),
            uniforms=draw_uniforms([row.request.params for row in rows], [row.budget for row in rows], seeds, device),
        )
        return batch, logits  # (B, V)

    def row_prefix(self, i: int) -> CachedPrefix | None:
        """Row ``i``'s cache without its padding, under the ids it holds (prompt and generated
        tokens but the last); None if the counts disagree."""
        row = self.rows[i]
        ids = row.request.prompt_ids + tuple(row.token_ids[:-1])
        keep = self.mask[i]
        if int(keep.sum()) != len(ids):
            return None
        return CachedPrefix(ids, tuple((k[i][:, keep], v[i][:, keep]) for k, v in _cache_tensors(self.cache)))

    def decode(self, model: Any) -> torch.Tensor:
        """One forward pass of every row's last token, which the cache then holds; return the
        logits (B, V) of the next tokens. ``positions``, ``steps`` and ``last`` are the caller's to
        advance once it has sampled."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self), 1)], dim=1)  # (B, L+1)
        out = model(
            input_ids=self.last[:, None],
            attention_mask=self.mask if self.padded else None,  # None: no mask to build or apply
            position_ids=self.positions[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1]

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

    def extend(self, other: RunningBatch) -> None:
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
        params = [row.request.params for row in self.rows]
        self.sampling = RowSampling.from_params(params, self.mask.device)
        self.padded = not bool(self.mask.all())


def prefill_key(row: Row) -> tuple[tuple[int, ...], int]:
    """Rows with equal keys have the same prefill: same prompt, same stored columns reused."""
    return row.request.prompt_ids, len(row.prefix.ids) if row.prefix is not None else 0


class SlackLayer(DynamicLayer):
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
    def holding(cls, keys: torch.Tensor, values: torch.Tensor) -> SlackLayer:
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

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int) -> None:
        """New buffers of ``capacity`` columns holding the first ``length`` columns of the cache."""
        batch, heads = key_states.shape[:2]
        keys = key_states.new_empty(batch, heads, capacity, key_states.shape[-1])
        values = value_states.new_empty(batch, heads, capacity, value_states.shape[-1])
        if length:
            keys[:, :, :length] = self.keys
            values[:, :, :length] = self.values
        self._key_buffer, self._value_buffer = keys, values


def check_cache_support(model: Any) -> None:
    """Raise ``ConfigError`` unless every layer of the model's cache is plain full attention."""
    layers = DynamicCache(config=model.config).layers
    unsupported = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if unsupported:
        raise ConfigError(f"HFBackend batches full-attention KV caches only; {type(model).__name__} uses {unsupported}")


def prompt_problem(prompt: tuple[int, ...], max_positions: int | None, vocab_size: int) -> str | None:
    """Why a prompt cannot run on the model (empty, too long, unknown token ids); None when it can."""
    if not prompt:
        return "the prompt is empty; a request needs at least one prompt token"
    if max_positions is not None and len(prompt) >= max_positions:
        return (
            f"the prompt has {len(prompt)} tokens but the model handles at most "
            f"{max_positions} positions (prompt plus at least one new token)"
        )
    low, high = min(prompt), max(prompt)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        return f"the prompt contains token id {bad}, outside the model's vocabulary [0, {vocab_size})"
    return None


def _cache_tensors(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _make_cache(tensors: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> Cache:
    return Cache(layers=[SlackLayer.holding(keys, values) for keys, values in tensors])


def _stored_cache(rows: list[Row], held: int) -> Cache:
    """A cache of ``held`` columns: each row's stored prefix, left-padded (zeros without one)."""
    template = next(row.prefix for row in rows if row.prefix is not None).layers
    layers = []
    for layer, (k0, v0) in enumerate(template):
        keys, values = [], []
        for row in rows:
            if row.prefix is None:
                keys.append(k0.new_zeros(k0.shape[0], held, k0.shape[2]))
                values.append(v0.new_zeros(v0.shape[0], held, v0.shape[2]))
            else:
                k, v = row.prefix.layers[layer]
                keys.append(_pad_left(k, held, dim=1))
                values.append(_pad_left(v, held, dim=1))
        layers.append((torch.stack(keys), torch.stack(values)))  # (B, H_kv, held, D)
    return _make_cache(layers)


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
