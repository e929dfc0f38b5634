"""Weight versions: which weights generated each token, and new weights between requests.

``VersionedBackend`` wraps the generation backend during asynchronous training. The weights the
backend serves have a version: the number of updates applied (a resumed run starts at its step).
Every completion comes back stamped with the version that generated it (``Completion.version``;
episodes record it per policy token, ``Trajectory.versions``).

New weights arrive *between requests* (in-flight updates): ``advance(push)`` waits for the
requests already running to finish, holds new ones back meanwhile, applies ``push`` (the weight
sync), and moves to the next version. An episode that is mid-way simply continues under the new
weights at its next turn, and its versions show the change. A request therefore never mixes two
versions, whatever the backend (in-process HF or vLLM, an OpenAI-compatible server, Ray replicas).

``pinned()`` holds the weights at one version for a while (an evaluation during training): an
update waits until it ends, and the evaluation reports the version it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import torch

from ..backends.base import Backend, SamplingParams
from ..types import Completion, Trajectory


class VersionedBackend(Backend):
    def __init__(self, backend: Backend, version: int = 0):
        self.inner = backend
        self.version = version
        self.accepts_images = backend.accepts_images
        self._changed = asyncio.Condition()
        self._running = 0  # requests in flight
        self._pins = 0  # pinned() holders
        self._updating = False  # an update waits for the running requests or is being applied

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, **kwargs: Any) -> Completion:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self._running += 1
            version = self.version
        try:
            completion = await self.inner.generate(prompt_ids, params, **kwargs)
        finally:
            async with self._changed:
                self._running -= 1
                self._changed.notify_all()
        return replace(completion, version=version)

    async def advance(self, push: Callable[[], Awaitable[None]]) -> int:
        """Apply ``push`` between requests and return the new version."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating and self._pins == 0)
            self._updating = True  # from here new requests wait
            await self._changed.wait_for(lambda: self._running == 0)
        try:
            await push()
        finally:
            async with self._changed:
                self.version += 1
                self._updating = False
                self._changed.notify_all()
        return self.version

    async def reached(self, version: int) -> None:
        """Return once the backend serves ``version`` or a later one."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.version >= version)

    @contextlib.asynccontextmanager
    async def pinned(self) -> AsyncIterator[int]:
        """No update while inside; yields the version served throughout."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._updating)
            self._pins += 1
            version = self.version
        try:
            yield version
        finally:
            async with self._changed:
                self._pins -= 1
                self._changed.notify_all()

    # what the engine and the trainer ask of a backend: the wrapped one's answers
    def shares_model(self, model: Any) -> bool:
        return self.inner.shares_model(model)

    def invalidate_cache(self) -> None:
        self.inner.invalidate_cache()

    async def close(self) -> None:  # whoever opened the wrapped backend closes it
        return None


def fresh_masks(masks: Sequence[torch.Tensor], owners: Sequence[int], trajectories: Sequence[Trajectory],
                oldest: int) -> tuple[list[torch.Tensor], int]:
    """``masks`` (one per segment of the trajectory ``owners`` names) without the policy tokens that
    a weight version older than ``oldest`` generated, and how many were removed. A trajectory
    without versions (its backend did not say) keeps its tokens."""
    out, stale, seen = [], 0, {}
    for mask, owner in zip(masks, owners):
        versions = trajectories[owner].versions
        policy = int(mask.sum()) if versions else 0
        start = seen.get(owner, 0)
        if versions:
            positions = torch.nonzero(mask, as_tuple=True)[0]
            old = torch.tensor(versions[start : start + len(positions)]) < oldest
            if old.any():
                mask = mask.clone()
                mask[positions[old]] = 0
                stale += int(old.sum())
        seen[owner] = start + policy
        out.append(mask)
    return out, stale
