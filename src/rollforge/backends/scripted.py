"""A scripted backend: replies chosen by a Python function, with a known, simulated latency.

It drives the engine's tests and benchmarks. The script receives the request (prompt ids and
sampling params) and returns the reply as text or token ids; the backend appends the end-of-turn
token, applies stop strings and the token budget exactly like a real backend, and sleeps
``latency + per_token_latency * n_tokens`` seconds without blocking the event loop. Logprobs are a
deterministic function of (prompt length, position, token id), so runs are reproducible.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..arguments import check_tokenizer, describe
from ..errors import BackendError, ConfigError
from ..types import Completion
from .base import Backend, SamplingParams, StopStrings


@dataclass(frozen=True)
class ScriptedRequest:
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    call: int  # 0-based index of this request among all requests the backend has served


Script = Callable[[ScriptedRequest], "str | Sequence[int]"]


class ScriptedBackend(Backend):
    """Replies from ``script``; ``tokenizer`` (an HF fast tokenizer, or any object whose
    ``encode(text)`` adds no special tokens and ``decode(ids)`` keeps them) turns text replies into ids and checks stop strings. ``end_token_id`` is appended to every
    reply that is not cut by a stop string or the budget (the model "ends its turn")."""

    def __init__(
        self,
        script: Script,
        tokenizer: Any,
        *,
        end_token_id: int | None = None,
        latency: float = 0.0,
        per_token_latency: float = 0.0,
        accepts_images: bool = False,
    ):
        if not callable(script):
            raise ConfigError(
                f"ScriptedBackend: script must be a function of a ScriptedRequest, got {describe(script)}"
            )
        check_tokenizer(tokenizer, "ScriptedBackend")
        self._script = script
        self._tokenizer = tokenizer
        self._encode = _encoder(tokenizer)
        self._decode = _decoder(tokenizer)
        self._end = end_token_id
        self.latency = latency
        self.per_token_latency = per_token_latency
        if accepts_images:  # else the class's declaration stands (a subclass may declare True)
            self.accepts_images = True
        self.calls = 0
        self._closed = False
        self._cache: dict[str, list[int]] = {}

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[Any] = ()
    ) -> Completion:
        """The script's reply; ``images`` (only with ``accepts_images``) are not looked at."""
        if self._closed:
            raise BackendError("the scripted backend is closed")
        request = ScriptedRequest(tuple(prompt_ids), params, self.calls)
        self.calls += 1
        reply = self._script(request)
        ids = self._encoded(reply) if isinstance(reply, str) else list(reply)
        ends = [self._end] if self._end is not None else list(params.stop_token_ids[:1])
        ids, finish = _apply_limits(ids + ends, params, StopStrings(self._decode, params.stop))
        delay = self.latency + self.per_token_latency * len(ids)
        if delay > 0:
            await asyncio.sleep(delay)
        n = len(prompt_ids)
        logprobs = tuple([-((n + i + token) % 97 + 1) / 50.0 for i, token in enumerate(ids)])
        return Completion(tuple(ids), logprobs, finish)

    async def close(self) -> None:
        self._closed = True

    def reopener(self) -> Callable[[], Backend]:
        """The same script, tokenizer and latencies; ``calls`` counts from 0 in each copy. Both must
        pickle (a module-level script, a tokenizer rather than a ``ChatRenderer``)."""
        return functools.partial(
            ScriptedBackend,
            self._script,
            self._tokenizer,
            end_token_id=self._end,
            latency=self.latency,
            per_token_latency=self.per_token_latency,
            accepts_images=self.accepts_images,
        )

    def _encoded(self, text: str) -> list[int]:
        """Scripts repeat themselves; the tokenizer's cost is not what a scripted run measures."""
        ids = self._cache.get(text)
        if ids is None:
            if len(self._cache) >= 4096:
                self._cache.clear()
            ids = self._cache[text] = self._encode(text)
        return list(ids)


def _apply_limits(ids: list[int], params: SamplingParams, stop: StopStrings) -> tuple[list[int], str]:
    limit, ends, strings = params.max_new_tokens, set(params.stop_token_ids), bool(stop)
    for i, token in enumerate(ids):
        if i >= limit:
            return ids[:i], "length"
        if token in ends or (strings and stop.completed_by_last(ids[: i + 1])):
            return ids[: i + 1], "stop"
    return ids, "stop"


def _encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is not None:
        return lambda text: fast.encode(text, add_special_tokens=False).ids
    return tokenizer.encode  # e.g. a ChatRenderer, whose encode adds no special tokens


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is not None:
        return lambda ids: fast.decode(list(ids), skip_special_tokens=False)
    return tokenizer.decode
