"""A backend that records every request, for benchmarks that replay the same work another way.

``RecordingBackend`` is a ``Backend`` around another one, in the shape of Gymnasium's ``Wrapper``:
it forwards every member the engine and the trainer may ask of a backend (``accepts_images``,
``shares_model``, ``invalidate_cache``, ``supports_sleep``, ``sleep``, ``wake_up``) and changes
only ``generate``, which keeps a ``Request`` (the episode it came from, the prompt ids, the
parameters and the completion) per call, in the order the calls finished. It does not close the
wrapped backend: whoever opened that closes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..backends.base import CURRENT_EPISODE, Backend, SamplingParams
from ..types import Completion


@dataclass(frozen=True)
class Request:
    episode: int  # id() of the episode's CURRENT_EPISODE object (the gateway's session): groups requests
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    completion: Completion


class RecordingBackend(Backend):
    def __init__(self, inner: Backend):
        self.inner = inner
        self.accepts_images = inner.accepts_images
        self.requests: list[Request] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        episode = id(CURRENT_EPISODE.get())
        completion = await self.inner.generate(prompt_ids, params)
        self.requests.append(Request(episode, tuple(prompt_ids), params, completion))
        return completion

    def per_episode(self) -> list[list[Request]]:
        """The requests grouped by episode, each group in order."""
        groups: dict[int, list[Request]] = {}
        for request in self.requests:
            groups.setdefault(request.episode, []).append(request)
        return list(groups.values())

    # the rest of what a backend declares: the wrapped one's answers
    def shares_model(self, model: Any) -> bool:
        return self.inner.shares_model(model)

    def invalidate_cache(self) -> None:
        self.inner.invalidate_cache()

    @property
    def supports_sleep(self) -> bool:
        return self.inner.supports_sleep

    async def sleep(self) -> None:
        await self.inner.sleep()

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self.inner.wake_up(tags)
