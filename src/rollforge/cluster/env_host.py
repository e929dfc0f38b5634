"""The body of an environment actor: one copy of the user's environment and the sessions open on
it, driven by batches of calls.

The driver does not make one Ray call per environment call (about a millisecond of CPU each on
both sides, which at thousands of concurrent episodes would cost more than the environments). It
sends ``submit(calls)``: every call its episodes made in one event-loop tick, each started at once
as its own task; and it keeps one ``collect()`` outstanding, which returns every result finished
since the last one, waiting for at least one. A slow call never holds back a fast one, and a
burst of calls costs two Ray calls. ``ready()`` answers once the actor runs, with the node it runs
on.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Sequence

from ..envs.base import Environment, Reset, Step
from ..errors import EnvironmentError_
from ..types import Message, Sample
from .connect import this_node

#: One call: (call id, method name, session id, arguments).
Call = tuple[int, str, int, tuple]
#: One result: (call id, succeeded, value or exception).
Result = tuple[int, bool, Any]


class EnvironmentHost:
    def __init__(self, environment: Environment):
        self._env = environment
        self._sessions: dict[int, Any] = {}
        self._conversations: dict[int, list[Message]] = {}
        self._finished: list[Result] = []
        self._ready = asyncio.Event()
        self._running: set[asyncio.Task] = set()

    # -- transport --------------------------------------------------------------------------------
    async def ready(self) -> tuple[str, str]:
        """Where this actor runs (``connect.this_node``); the pool asks once, when it starts."""
        return this_node()

    async def pid(self) -> int:
        """This actor's process id (``bench scale`` reads its peak memory from ``/proc``)."""
        return os.getpid()

    async def submit(self, calls: Sequence[Call]) -> None:
        for call in calls:
            task = asyncio.create_task(self._run(*call))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def collect(self) -> list[Result]:
        await self._ready.wait()
        finished, self._finished = self._finished, []
        self._ready.clear()
        return finished

    async def _run(self, call_id: int, method: str, sid: int, args: tuple) -> None:
        try:
            result: Result = (call_id, True, await getattr(self, "_" + method)(sid, *args))
        except Exception as exc:
            result = (call_id, False, _portable(exc))
        self._finished.append(result)
        self._ready.set()

    # -- the environment ---------------------------------------------------------------------------
    async def prepare(self, sessions: int) -> bool:
        """Run the environment's own ``prepare``; whether it may now produce images (a remote
        environment knows once it has read its server's schema)."""
        await self._env.prepare(sessions)
        return bool(self._env.produces_images)

    async def release(self) -> None:
        await self._env.release()

    async def _reset(self, sid: int, sample: Sample) -> Reset:
        session = self._sessions[sid] = self._env.open(sample)
        self._conversations[sid] = []
        return await session.reset(sample)

    async def _step(self, sid: int, new_messages: Sequence[Message]) -> tuple[Step, Any]:
        session = self._session(sid)
        conversation = self._conversations[sid]
        conversation += new_messages
        step = await session.step(tuple(conversation))
        return step, session.metadata

    async def _finish(self, sid: int) -> tuple[float, Any, Any, Exception | None]:
        """The final reward, then close (the engine closes right after, so one call does both);
        an error of ``close`` comes back to be raised by the driver's ``close``."""
        session = self._session(sid)
        try:
            bonus = await session.finish()
            result = bonus, session.metadata, _picklable_or_none(session.handle)
        except BaseException:
            await self._close(sid)
            raise
        try:
            await self._close(sid)
        except Exception as exc:
            return (*result, _portable(exc))
        return (*result, None)

    async def _close(self, sid: int) -> None:
        self._conversations.pop(sid, None)
        session = self._sessions.pop(sid, None)
        if session is not None:
            await session.close()

    def _session(self, sid: int) -> Any:
        try:
            return self._sessions[sid]
        except KeyError:
            raise EnvironmentError_(
                f"session {sid} is not open on this environment actor (pid {os.getpid()})"
            ) from None


def _picklable_or_none(value: Any) -> Any:
    if value is None or _pickles(value):
        return value
    return None


def _portable(exc: Exception) -> Exception:
    """The exception itself when it pickles, else one that says the same."""
    return exc if _pickles(exc) else EnvironmentError_(f"{type(exc).__name__}: {exc}")


def _pickles(value: Any) -> bool:
    from ray import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception:
        return False
    return True
