"""Environments in a pool of Ray actors.

``RayEnvironmentPool(environment, actors=N)`` is itself an ``Environment``: the engine opens
sessions on it as on any other. The user's environment (an environment class wrapped by
``FactoryEnvironment``, a step-style adapter, an OpenEnv client: any ``Environment``) is shipped
to every actor once and stays plain Python; each actor is an async Ray actor that holds many
sessions at once, so sync user code runs in the actor's worker threads exactly as it would
locally.

- **Placement**: a new episode goes to the actor holding the fewest live sessions.
- **Traffic**: each step sends only the messages added since the last one (the actor keeps the
  conversation), so a long episode costs O(new messages) per turn, not O(conversation).
- **Actor death** (a crash, an OOM kill, ``ray.kill``, a lost node) fails exactly the episodes that
  actor held, each with ``actor died`` and Ray's reason, and the pool starts a replacement in its
  slot. An episode whose first call (``reset``) finds its actor dead held nothing yet: it is moved
  to the replacement instead of failing.
- **Reward functions** receive, as ``environments``, a copy of each episode's environment object
  taken when the episode finished (``None`` when the object cannot be pickled).
- ``max_sessions``, ``produces_images`` and the ``prepare(sessions)``/``release()`` hooks of the
  wrapped environment are passed through; ``shutdown()`` stops the actors.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from typing import Any, Sequence

from ..envs.base import BaseSession, Environment, Reset, Step
from ..errors import ConfigError, EnvironmentError_
from ..types import Message, Sample
from .connect import import_ray, worker_runtime_env


class EnvironmentHost:
    """The actor body: one copy of the user's environment and the sessions open on it."""

    def __init__(self, environment: Environment):
        self._env = environment
        self._sessions: dict[int, Any] = {}
        self._conversations: dict[int, list[Message]] = {}

    async def ready(self) -> int:
        return os.getpid()

    async def prepare(self, sessions: int) -> bool:
        """Run the environment's own ``prepare``; whether it may now produce images (a remote
        environment knows once it has read its server's schema)."""
        if callable(getattr(self._env, "prepare", None)):
            await self._env.prepare(sessions)
        return bool(getattr(self._env, "produces_images", False))

    async def release(self) -> None:
        if callable(getattr(self._env, "release", None)):
            await self._env.release()

    async def reset(self, sid: int, sample: Sample) -> Reset:
        session = self._sessions[sid] = self._env.open(sample)
        self._conversations[sid] = []
        return await session.reset(sample)

    async def step(self, sid: int, new_messages: Sequence[Message]) -> tuple[Step, Any]:
        session = self._session(sid)
        conversation = self._conversations[sid]
        conversation += new_messages
        step = await session.step(tuple(conversation))
        return step, session.metadata

    async def finish(self, sid: int) -> tuple[float, Any, Any, Exception | None]:
        """The final reward, then close (the engine closes right after, so one round trip does
        both); an error of ``close`` comes back to be raised by the driver's ``close``."""
        session = self._session(sid)
        try:
            bonus = await session.finish()
            result = bonus, session.metadata, _picklable_or_none(session.handle)
        except BaseException:
            await self.close(sid)
            raise
        try:
            await self.close(sid)
        except Exception as exc:
            return (*result, exc)
        return (*result, None)

    async def close(self, sid: int) -> None:
        self._conversations.pop(sid, None)
        session = self._sessions.pop(sid, None)
        if session is not None:
            await session.close()

    def _session(self, sid: int) -> Any:
        try:
            return self._sessions[sid]
        except KeyError:
            raise EnvironmentError_(f"session {sid} is not open on this environment actor (pid {os.getpid()})") from None


class RayEnvironmentPool:
    """An ``Environment`` whose sessions run on ``actors`` Ray actors (see the module docstring).
    ``num_cpus`` and ``memory_mb`` are reserved per actor; Ray must already be initialised
    (``cluster.connect.ensure_ray``)."""

    def __init__(
        self,
        environment: Environment,
        *,
        actors: int = 2,
        num_cpus: float = 1.0,
        memory_mb: int | None = None,
        name: str = "env",
        start_timeout: float = 120.0,
    ):
        if actors < 1:
            raise ConfigError(f"an environment pool needs at least 1 actor, got actors={actors}")
        if num_cpus < 0:
            raise ConfigError(f"num_cpus per environment actor must be >= 0, got {num_cpus}")
        if memory_mb is not None and memory_mb <= 0:
            raise ConfigError(f"memory_mb per environment actor must be > 0, got {memory_mb}")
        ray = import_ray()
        if not ray.is_initialized():
            raise ConfigError("Ray is not initialised: call rollforge.cluster.connect.ensure_ray() first")
        self.environment = environment
        self.name = name
        self.max_sessions = getattr(environment, "max_sessions", None)
        self.produces_images = bool(getattr(environment, "produces_images", False))
        self.start_timeout = start_timeout
        options: dict[str, Any] = {
            "num_cpus": num_cpus, "max_concurrency": 100_000, "max_restarts": 0, "runtime_env": worker_runtime_env(),
        }
        if memory_mb is not None:
            options["memory"] = memory_mb * 1024 * 1024
        self._actor_class = ray.remote(EnvironmentHost).options(**options)
        try:
            self._shipped = ray.put(environment)
        except TypeError as exc:
            raise ConfigError(
                f"environment {name!r} ({environment!r}) cannot be shipped to Ray actors: "
                f"{str(exc).splitlines()[0]}; it must pickle (cloudpickle): open connections, locks and "
                "processes in reset() or lazily, not in __init__, or give the class __getstate__"
            ) from None
        self._slots: list[Any] = [self._start() for _ in range(actors)]
        self._load = [0] * actors
        self._ids = itertools.count()
        self.replacements = 0

    def _start(self) -> Any:
        return self._actor_class.remote(self._shipped)

    # -- Environment protocol -------------------------------------------------------------------
    def open(self, sample: Sample) -> "RemoteSession":
        slot = min(range(len(self._slots)), key=self._load.__getitem__)
        self._load[slot] += 1
        return RemoteSession(self, slot, next(self._ids))

    async def prepare(self, sessions: int) -> None:
        """Wait until every actor runs (bounded by ``start_timeout``; an actor that dies while
        starting is replaced), then give each its share of the sessions for the wrapped
        environment's own ``prepare``."""
        try:
            async with asyncio.timeout(self.start_timeout):
                await asyncio.gather(*(self._started(slot) for slot in range(len(self._slots))))
        except TimeoutError:
            raise ConfigError(
                f"environment actors of {self.name!r} did not start within {self.start_timeout}s; does the "
                "cluster have the CPUs and memory they reserve?"
            ) from None
        share = math.ceil(sessions / len(self._slots))
        images = await asyncio.gather(*(actor.prepare.remote(share) for actor in self._slots))
        self.produces_images = any(images)

    async def _started(self, slot: int, attempts: int = 3) -> None:
        ray = import_ray()
        for attempt in range(attempts):
            actor = self._slots[slot]
            try:
                await actor.ready.remote()
                return
            except ray.exceptions.RayActorError as exc:
                if attempt == attempts - 1:
                    raise EnvironmentError_(
                        f"environment actor {slot} of {self.name!r} died {attempts} times while starting: {_reason(exc)}"
                    ) from None
                self.replace(slot, actor)

    async def release(self) -> None:
        if callable(getattr(self.environment, "release", None)):
            await asyncio.gather(*(actor.release.remote() for actor in self._slots), return_exceptions=True)

    def shutdown(self) -> None:
        ray = import_ray()
        for actor in self._slots:
            ray.kill(actor)

    # -- used by sessions -------------------------------------------------------------------------
    def actor(self, slot: int) -> Any:
        return self._slots[slot]

    def replace(self, slot: int, dead: Any) -> None:
        """Start a new actor in ``slot`` unless another session already did."""
        if self._slots[slot] is dead:
            self._slots[slot] = self._start()
            self.replacements += 1

    def done(self, slot: int) -> None:
        self._load[slot] -= 1


class RemoteSession(BaseSession):
    """The driver's side of one episode on an environment actor."""

    def __init__(self, pool: RayEnvironmentPool, slot: int, sid: int):
        self._pool, self._slot, self._sid = pool, slot, sid
        self._actor = pool.actor(slot)
        self._sent = 0
        self._metadata: Any = None
        self._handle: Any = None
        self._remote_open = True
        self._close_error: Exception | None = None
        self._closed = False

    async def reset(self, sample: Sample) -> Reset:
        try:
            return await self._call("reset", sample)
        except ActorDied:
            self._actor = self._pool.actor(self._slot)  # held nothing yet: start on the replacement
            return await self._call("reset", sample)

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        new, self._sent = conversation[self._sent :], len(conversation)
        step, self._metadata = await self._call("step", new)
        return step

    async def finish(self) -> float:
        self._remote_open = False  # the actor closes the session after finishing it
        bonus, self._metadata, self._handle, self._close_error = await self._call("finish")
        return bonus

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.done(self._slot)
        if self._close_error is not None:
            raise self._close_error
        if self._remote_open:
            try:
                await self._call("close")
            except ActorDied:
                pass  # its sessions died with it

    @property
    def metadata(self) -> Any:
        return self._metadata

    @property
    def handle(self) -> Any:
        return self._handle

    async def _call(self, method: str, *args: Any) -> Any:
        ray = import_ray()
        actor = self._actor
        try:
            return await getattr(actor, method).remote(self._sid, *args)
        except ray.exceptions.RayActorError as exc:
            self._pool.replace(self._slot, actor)
            raise ActorDied(f"environment actor {self._slot} of {self._pool.name!r} died: {_reason(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            raise exc.as_instanceof_cause() from None  # the environment's own exception, as locally


class ActorDied(EnvironmentError_):
    """The environment actor holding this episode died."""


def _reason(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    why = [line for line in lines if "actor is dead because" in line.lower() or "died because" in line.lower()]
    return " ".join(why or lines[:1]) or type(exc).__name__


def _picklable_or_none(value: Any) -> Any:
    if value is None:
        return None
    from ray import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception:
        return None
    return value
