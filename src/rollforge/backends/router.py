"""Generation replicas behind one router: sticky per episode, least-loaded placement of new ones.

``RouterBackend(replicas)`` is itself a ``Backend``. Each replica is any backend (a served model,
a vLLM engine or HF model on a Ray actor, ...) holding the same weights.

- **Sticky routing**: the engine sets ``CURRENT_EPISODE`` in each episode's task; every turn of an
  episode goes to the replica that served its first turn, so the replica's prefix cache holds the
  conversation so far. Placements are keyed by the episode object's identity with a weak
  reference whose callback drops the entry (and the replica's live-episode count) when the episode
  object dies (the engine's episode state is an unhashable dataclass, so a ``WeakKeyDictionary``
  cannot hold it). An object that cannot be weakly referenced is pinned in a bounded LRU dict.
- **Placement**: a new episode (or a call outside any episode, which is not recorded) goes to the
  replica with the fewest requests in flight; ties go to the fewest live episodes, then the lowest
  index. A replica whose ``dead`` holds a reason (``Backend.dead``; Ray replicas set it when their
  actor dies) gets no new episodes; the episodes already on it fail there with its own error.
- **Counters** (for tests and metrics): ``requests``, ``episodes`` (placed, cumulative),
  ``live_episodes``, ``in_flight`` and ``failures`` per replica, as lists in replica order;
  ``stats()`` gives them by replica name.
- **Weight sync**: the router ``syncs_weights`` only when every replica does (its
  ``weight_version`` is then the minimum of the replicas'); otherwise it has no ``weight_version``
  and ``update_weights`` refuses, so a trainer refuses the router rather than train on a policy it
  cannot update. All replicas are updated concurrently while new requests wait at the weight gate
  (``backends/gate.py``, holding without draining: each replica finishes its requests in flight on
  the old weights, as the ``WeightSync`` protocol requires). Each distinct ``share_weights``
  (``Backend.share_weights``: a function of the model declared per replica class) is called once
  and its result handed to every replica that has it (Ray replicas: the exported state dict, put
  once in the object store). If any replica fails, the router raises ``BackendError`` naming it and
  refuses to generate until an update succeeds on every replica: it never serves mixed weights.
- ``accepts_images`` only when every replica accepts images. ``close()`` closes every replica.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import weakref
from typing import Any, Sequence

from ..errors import BackendError, ConfigError
from ..types import Completion
from .base import CURRENT_EPISODE, Backend, SamplingParams
from .gate import WeightGate


class RouterBackend(Backend):
    """One backend over ``replicas`` (see the module docstring). ``names`` label the replicas in
    errors and ``stats()`` (default: each replica's ``name``, else ``replica <i>``);
    ``max_pinned`` bounds placements of episode objects that cannot be weakly referenced."""

    def __init__(self, replicas: Sequence[Backend], *, names: Sequence[str] | None = None, max_pinned: int = 65536):
        if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence):
            raise ConfigError(f"RouterBackend needs a list of backends, got {type(replicas).__name__}")
        if not replicas:
            raise ConfigError("RouterBackend needs at least one replica, got an empty list")
        for i, replica in enumerate(replicas):
            if not isinstance(replica, Backend):
                raise ConfigError(
                    f"replica {i} ({type(replica).__name__}) is not a backend: it does not subclass rollforge Backend"
                )
        if names is None:
            names = [r.name or f"replica {i}" for i, r in enumerate(replicas)]
        if len(names) != len(replicas):
            raise ConfigError(f"got {len(names)} names for {len(replicas)} replicas")
        if max_pinned < 1:
            raise ConfigError(f"max_pinned must be >= 1, got {max_pinned}")
        self.replicas = tuple(replicas)
        self.names = tuple(str(n) for n in names)
        n = len(self.replicas)
        self.requests, self.episodes, self.live_episodes = [0] * n, [0] * n, [0] * n
        self.in_flight, self.failures = [0] * n, [0] * n
        self.accepts_images = all(r.accepts_images for r in self.replicas)
        self._placed: dict[int, tuple[weakref.ref, int]] = {}
        self._pinned: collections.OrderedDict[int, tuple[object, int]] = collections.OrderedDict()
        self._max_pinned = max_pinned
        self._gate = WeightGate()  # holds new requests while weights are swapped
        self._mixed: str | None = None  # why generation is refused after a partial weight update
        self._closed = False

    # --- the Backend protocol ----------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, images: Any = None) -> Completion:
        async with self._gate.request():
            if self._closed:
                raise BackendError("the router backend is closed")
            if self._mixed is not None:
                raise BackendError(self._mixed)
            index = self._route(CURRENT_EPISODE.get())
            replica = self.replicas[index]
            self.requests[index] += 1
            self.in_flight[index] += 1
            try:
                if images is None:
                    return await replica.generate(prompt_ids, params)
                return await replica.generate(prompt_ids, params, images=images)
            except Exception:
                self.failures[index] += 1
                raise
            finally:
                self.in_flight[index] -= 1

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        results = await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)
        failed = self._failed(results)
        if failed:
            raise BackendError(f"closing replicas failed: {failed}")

    def stats(self) -> dict[str, dict[str, int]]:
        """The counters by replica name."""
        return {
            name: {
                "requests": self.requests[i],
                "episodes": self.episodes[i],
                "live_episodes": self.live_episodes[i],
                "in_flight": self.in_flight[i],
                "failures": self.failures[i],
            }
            for i, name in enumerate(self.names)
        }

    # --- weight sync (when every replica has it) -----------------------------------------------

    @property
    def syncs_weights(self) -> bool:
        return all(r.syncs_weights for r in self.replicas)

    @property
    def weight_version(self) -> int:
        """The oldest replica's; absent (``AttributeError``) unless every replica syncs weights."""
        if not self.syncs_weights:
            raise AttributeError(f"weight_version: {self._without_sync()} of this router have no weight sync")
        return min(r.weight_version for r in self.replicas)  # type: ignore[attr-defined]

    async def update_weights(self, model: Any) -> None:
        """Serve ``model``'s weights on every replica from the next request on (see the module docstring)."""
        if self._closed:
            raise BackendError("the router backend is closed")
        if not self.syncs_weights:
            raise BackendError(f"{self._without_sync()} of this router have no weight sync (update_weights)")
        if self._gate.updating:
            raise BackendError("update_weights is already running on this router")
        # Only hold new requests: each replica finishes its own in flight on the old weights
        # (``WeightSync``), so no replica waits for another's slowest request.
        async with self._gate.update(drain=False):
            shared: dict[Any, Any] = {}  # one result per distinct share_weights
            for replica in self.replicas:
                if replica.share_weights not in shared:
                    shared[replica.share_weights] = await asyncio.to_thread(replica.share_weights, model)
            updates = [r.update_weights(shared[r.share_weights]) for r in self.replicas]  # type: ignore[attr-defined]
            failed = self._failed(await asyncio.gather(*updates, return_exceptions=True))
            if failed:
                self._mixed = (
                    f"the replicas may serve different weights: the last weight update failed on {failed}; "
                    "generation is refused until update_weights succeeds on every replica"
                )
                raise BackendError(f"updating the weights failed on {failed}")
            self._mixed = None

    # --- placement ---------------------------------------------------------------------------

    def _route(self, episode: object | None) -> int:
        if episode is None:
            return self._least_loaded()
        key = id(episode)
        placed = self._placed.get(key)
        if placed is not None and placed[0]() is episode:
            return placed[1]
        pinned = self._pinned.get(key)
        if pinned is not None and pinned[0] is episode:
            self._pinned.move_to_end(key)
            return pinned[1]
        index = self._least_loaded()
        self.episodes[index] += 1
        self.live_episodes[index] += 1
        try:
            self._placed[key] = (weakref.ref(episode, functools.partial(self._forget, key)), index)
        except TypeError:  # cannot be weakly referenced: pin it, evicting the least recently used
            self._pinned[key] = (episode, index)
            if len(self._pinned) > self._max_pinned:
                _, (_, evicted) = self._pinned.popitem(last=False)
                self.live_episodes[evicted] -= 1
        return index

    def _least_loaded(self) -> int:
        alive = [i for i, r in enumerate(self.replicas) if not r.dead] or range(len(self.replicas))
        return min(alive, key=lambda i: (self.in_flight[i], self.live_episodes[i], i))

    def _forget(self, key: int, ref: weakref.ref) -> None:
        placed = self._placed.get(key)
        if placed is not None and placed[0] is ref:
            del self._placed[key]
            self.live_episodes[placed[1]] -= 1

    def _without_sync(self) -> str:
        return ", ".join(name for name, r in zip(self.names, self.replicas) if not r.syncs_weights)

    def _failed(self, results: Sequence[Any]) -> str:
        """``name (Error: message); ...`` for the replicas whose result is an exception."""
        return "; ".join(
            f"{name} ({type(r).__name__}: {r})" for name, r in zip(self.names, results) if isinstance(r, BaseException)
        )
