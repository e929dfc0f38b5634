"""Time limits for the episode loop's many short calls: ``async with deadline(seconds)``.

It behaves as ``asyncio.timeout``: when the limit passes, the task is cancelled and the block
raises ``TimeoutError``; ``expired()`` says whether it did. ``asyncio.timeout`` schedules one timer
per block on the event loop's heap and cancels it on exit, so a rollout with thousands of episodes in
flight pays two heap operations for every generation and every environment call (a quarter of the
engine's CPU per turn). Here the limits share timers: each limit is rounded *up* to the next tick
of ``RESOLUTION`` seconds, all limits ending on the same tick share one timer, and leaving a block
only removes it from its tick's set. A limit therefore fires at most ``RESOLUTION`` late and never
early.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from typing import Any

RESOLUTION = 0.01  # seconds: how late a limit may fire
_EMPTY = contextvars.Context()


class Deadline:
    """One block's limit (what ``deadline`` returns); single use, like ``asyncio.timeout``."""

    __slots__ = ("_seconds", "_task", "_tick", "_cancelling", "_expired", "_ticks")

    def __init__(self, seconds: float | None):
        self._seconds = seconds
        self._task: asyncio.Task | None = None
        self._tick: int | None = None
        self._ticks: _Ticks | None = None
        self._cancelling = 0
        self._expired = False

    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self) -> "Deadline":
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("deadline() must be used inside a task")
        self._task, self._cancelling = task, task.cancelling()
        if self._seconds is not None:
            loop = asyncio.get_running_loop()
            self._ticks = _ticks(loop)
            self._tick = self._ticks.add(self, loop.time() + self._seconds)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._ticks is not None and not self._expired:
            self._ticks.discard(self._tick, self)
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()


def deadline(seconds: float | None) -> Deadline:
    """A limit of ``seconds`` on an ``async with`` block; ``None``: no limit."""
    return Deadline(seconds)


class _Ticks:
    """One event loop's pending limits, grouped by the tick they end on, with each tick's timer. A
    tick whose last limit is discarded (the episode ended first) drops its timer at once: a long
    limit (an episode's 30 minutes) must not keep a timer and a dict per 10 ms for its whole span."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._pending: dict[int, dict[int, Deadline]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def add(self, limit: Deadline, when: float) -> int:
        tick = math.ceil(when / RESOLUTION)
        waiting = self._pending.get(tick)
        if waiting is None:
            waiting = self._pending[tick] = {}
            # in an empty context: the caller's (an episode's context variables) must not live as long as the timer
            self._timers[tick] = self._loop.call_at(tick * RESOLUTION, self._fire, tick, context=_EMPTY)
        waiting[id(limit)] = limit
        return tick

    def discard(self, tick: int, limit: Deadline) -> None:
        waiting = self._pending.get(tick)
        if waiting is None:
            return
        waiting.pop(id(limit), None)
        if not waiting:
            del self._pending[tick]
            self._timers.pop(tick).cancel()

    def __len__(self) -> int:
        """Ticks with a limit still pending (each holds one timer)."""
        return len(self._pending)

    def _fire(self, tick: int) -> None:
        self._timers.pop(tick, None)
        for limit in self._pending.pop(tick, {}).values():
            limit._expire()


_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ticks]" = weakref.WeakKeyDictionary()


def _ticks(loop: asyncio.AbstractEventLoop) -> _Ticks:
    ticks = _BY_LOOP.get(loop)
    if ticks is None:
        ticks = _BY_LOOP[loop] = _Ticks(loop)
    return ticks
