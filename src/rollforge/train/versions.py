"""Weight versions: which weights generated each token, and new weights between requests.

``VersionedBackend`` wraps the generation backend during asynchronous training. The weights the
backend serves have a version: the number of updates applied (a resumed run starts at its step).
Every completion comes back stamped with the version that generated it (``Completion.version``;
episodes record it per policy token, ``Trajectory.versions``).

New weights arrive *between requests* (in-flight updates): ``advance(push)`` passes the weight gate
(``backends/gate.py``): it holds new requests back, waits for the requests already running to
finish, applies ``push`` (the weight sync), and moves to the next version. An episode that is
mid-way simply continues under the new weights at its next turn, and its versions show the change.
A request therefore never mixes two versions, whatever the backend (in-process HF or vLLM, an
OpenAI-compatible server, Ray replicas).

``pinned()`` holds the weights at one version for a while (an evaluation during training): an
update waits until it ends, and the evaluation reports the version it saw.

``VersionedBackend`` is a ``BackendWrapper``: everything else is the wrapped backend's, and its own
``update_weights`` is the wrapped one's applied through ``advance``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import torch

from ..backends.base import Backend, BackendWrapper, SamplingParams
from ..backends.gate import WeightGate
from ..types import Completion, Trajectory


class VersionedBackend(BackendWrapper):
    """``backend`` with every completion stamped by the version of the weights that generated it;
    everything else the wrapped backend's (``BackendWrapper``), which it does not close."""

    def __init__(self, backend: Backend, version: int = 0):
        super().__init__(backend)
        self.version = version
        self._gate = WeightGate()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, **kwargs: Any) -> Completion:
        async with self._gate.request():
            version = self.version
            completion = await self.inner.generate(prompt_ids, params, **kwargs)
        return replace(completion, version=version)

    async def advance(self, push: Callable[[], Awaitable[None]]) -> int:
        """Apply ``push`` between requests and return the new version."""
        async with self._gate.update():
            try:
                await push()
            finally:
                self.version += 1
        return self.version

    async def update_weights(self, model: Any) -> None:
        """The wrapped backend's weight sync, applied between requests as the next version."""
        await self.advance(lambda: super(VersionedBackend, self).update_weights(model))

    async def reached(self, version: int) -> None:
        """Return once the backend serves ``version`` or a later one."""
        await self._gate.wait_until(lambda: self.version >= version)

    @contextlib.asynccontextmanager
    async def pinned(self) -> AsyncIterator[int]:
        """No update while inside; yields the version served throughout."""
        async with self._gate.pinned():
            yield self.version


def fresh_masks(
    masks: Sequence[torch.Tensor], owners: Sequence[int], trajectories: Sequence[Trajectory], oldest: int
) -> tuple[list[torch.Tensor], int]:
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
