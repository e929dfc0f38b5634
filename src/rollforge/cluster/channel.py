"""The driver's side of ``env_host``'s batched transport: one ``Channel`` per environment actor.

``call(method, sid, *args)`` queues the call and returns an awaitable of its result; the queue is
sent as one ``submit`` at the end of the current event-loop tick, and a single ``collect`` stays
outstanding while any call is pending, handing each result to its caller as it arrives. When the
actor dies, every pending call fails with ``ActorDied`` (with Ray's reason) and ``on_death`` runs
once.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable

from ..errors import ActorDied
from .connect import actor_death_reason, import_ray


class Channel:
    def __init__(self, actor: Any, label: str, on_death: Callable[[], None]):
        self.actor = actor
        self._label = label
        self._on_death = on_death
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._outbox: list[tuple] = []
        self._collector: asyncio.Task | None = None
        self._dead: str | None = None

    def call(self, method: str, sid: int, *args: Any) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self._dead is not None:
            future.set_exception(ActorDied(self._dead))
            return future
        call_id = next(self._ids)
        self._pending[call_id] = future
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append((call_id, method, sid, args))
        return future

    def _flush(self) -> None:
        calls, self._outbox = self._outbox, []
        if not calls or self._dead is not None:
            return
        self.actor.submit.remote(calls)  # a dead actor shows in collect
        if self._collector is None or self._collector.done():
            self._collector = asyncio.ensure_future(self._collect())

    async def _collect(self) -> None:
        ray = import_ray()
        while self._pending:
            try:
                results = await self.actor.collect.remote()
            except ray.exceptions.RayActorError as exc:
                self._die(f"environment actor {self._label} died: {actor_death_reason(exc)}")
                return
            for call_id, ok, value in results:
                future = self._pending.pop(call_id, None)
                if future is None or future.done():  # its caller gave up (a step timeout)
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    def _die(self, reason: str) -> None:
        self._dead = reason
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ActorDied(reason))
        self._on_death()
