"""The weight gate: new weights go in between requests, never under one.

Every place that swaps a backend's weights while requests run (a Ray replica's actor, the router
over replicas, the weight versions of asynchronous training) does it through one ``WeightGate``:

- ``async with gate.request():`` around each request: it waits while an update is held or applied,
  then counts as in flight until it ends.
- ``async with gate.update():`` around applying new weights: it *holds* new requests, *drains* (waits
  until the requests in flight have finished, on the old weights), lets the body *apply* the
  weights, and on the way out (success, error or cancellation) the held requests *resume*. Updates
  run one at a time. ``drain=False`` only holds: for a router whose replicas each drain their own.
- ``async with gate.pinned():`` no update starts while inside (an evaluation that must see one
  version); requests still run.
- ``await gate.wait_until(ready)``: returns once ``ready()`` holds, checked after every change of the
  gate (a caller that changes its own state inside ``update()`` is woken when the update ends).

One ``asyncio.Condition`` carries every change; the gate belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator, Callable


class WeightGate:
    """Hold / drain / apply / resume (see the module docstring). ``in_flight`` counts the requests
    inside ``request()``; ``updating`` is true from the moment an update holds new requests until
    it ends."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.updating = False
        self._pins = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self.updating)
            self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            await self._notify()

    @contextlib.asynccontextmanager
    async def update(self, *, drain: bool = True) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self.updating and self._pins == 0)
            self.updating = True  # from here new requests wait
        try:
            if drain:
                await self.wait_until(lambda: self.in_flight == 0)
            yield
        finally:
            self.updating = False
            await self._notify()

    @contextlib.asynccontextmanager
    async def pinned(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self.updating)
            self._pins += 1
        try:
            yield
        finally:
            self._pins -= 1
            await self._notify()

    async def wait_until(self, ready: Callable[[], bool]) -> None:
        async with self._changed:
            await self._changed.wait_for(ready)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
