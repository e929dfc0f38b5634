"""A backend that records every request: what the token-exactness checks compare trajectories
with, and what benchmarks replay the same work from another way.

``RecordingBackend`` is a ``BackendWrapper`` (``backends/base.py``): every member the engine and the
trainer may ask of a backend is the wrapped one's; it changes only ``generate``, which keeps a
``Request`` (the episode it came from, the prompt ids, the parameters and the completion) per call,
in the order the calls finished. ``calls`` are the same requests as (prompt ids, completion) pairs,
``per_episode()`` groups them by episode. It does not close the wrapped backend: whoever opened
that closes it.

``AllAtOnce`` is a wrapper for tests that claim many episodes or sessions run at once: timing cannot
show it (on a loaded machine the first may finish before the last starts), a barrier can. Its first
``n`` requests wait until all ``n`` are in flight (bounded by ``HANG_SECONDS``: if fewer ever
arrive they fail instead of hanging); ``peak`` is the most requests in flight at one time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Sequence

from ..backends.base import CURRENT_EPISODE, Backend, BackendWrapper, SamplingParams
from ..types import Completion
from .harness import HANG_SECONDS


@dataclass(frozen=True)
class Request:
    """One finished ``generate`` call."""

    episode: int  # id() of the episode's CURRENT_EPISODE object (the gateway's session): groups requests
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    completion: Completion


class RecordingBackend(BackendWrapper):
    """The wrapped backend, keeping every request it answered (see the module docstring)."""

    def __init__(self, inner: Backend):
        super().__init__(inner)
        self.requests: list[Request] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, **kwargs: Any) -> Completion:
        episode = id(CURRENT_EPISODE.get())
        completion = await self.inner.generate(prompt_ids, params, **kwargs)
        self.requests.append(Request(episode, tuple(prompt_ids), params, completion))
        return completion

    @property
    def calls(self) -> list[tuple[tuple[int, ...], Completion]]:
        """Every request as (prompt ids, completion), in the order they finished."""
        return [(request.prompt_ids, request.completion) for request in self.requests]

    def per_episode(self) -> list[list[Request]]:
        """The requests grouped by episode, each group in order."""
        groups: dict[int, list[Request]] = {}
        for request in self.requests:
            groups.setdefault(request.episode, []).append(request)
        return list(groups.values())


class AllAtOnce(BackendWrapper):
    """``inner``, with its first ``n`` requests held until all ``n`` are in flight."""

    def __init__(self, inner, n: int):
        super().__init__(inner)
        self.n, self.arrived, self.now, self.peak = n, 0, 0, 0
        self.all_here = asyncio.Event()

    async def generate(self, prompt_ids, params, *args, **kwargs):
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            if self.arrived < self.n:
                self.arrived += 1
                if self.arrived == self.n:
                    self.all_here.set()
                await asyncio.wait_for(self.all_here.wait(), HANG_SECONDS)
            return await self.inner.generate(prompt_ids, params, *args, **kwargs)
        finally:
            self.now -= 1
