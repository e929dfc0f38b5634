"""Environments in a pool of Ray actors.

``RayEnvironmentPool(environment, actors=N)`` is itself an ``Environment``: the engine opens
sessions on it as on any other. The user's environment (an environment class wrapped by
``FactoryEnvironment``, a step-style adapter, an OpenEnv client: any ``Environment``) is shipped
to every actor once and stays plain Python; each actor is an async Ray actor that holds many
sessions at once, so sync user code runs in the actor's worker threads exactly as it would
locally.

- **Placement**: a new episode goes to the actor holding the fewest live sessions.
- **Traffic**: each step sends only the messages added since the last one (the actor keeps the
  conversation), so a long episode costs O(new messages) per turn, not O(conversation); the calls
  of all episodes on one actor travel in batches (``env_host``, ``channel``), not one Ray call each.
- **Actor death** (a crash, an OOM kill, ``ray.kill``, a lost node) fails exactly the episodes that
  actor held, each with ``actor died`` and Ray's reason, and the pool starts a replacement in its
  slot. An episode whose first call (``reset``) finds its actor dead held nothing yet: it is moved
  to the replacement instead of failing. New episodes go only to actors that run: a replacement
  the cluster cannot place (a lost node took its CPUs) gets none until it starts, and the pool
  says so in one log line, so the surviving actors carry the load instead of episodes waiting out
  the step timeout on an actor that never comes.
- **Reward functions** receive, as ``environments``, a copy of each episode's environment object
  taken when the episode finished (``None`` when the object cannot be pickled).
- **Where**: each actor says once which node it runs on (its ``ready()``, the call that tells the
  pool it started); a session reports the actor that held it (``RemoteSession.placement``: after a
  move, the replacement's) as ``<name>/<slot>`` with that node, and the engine writes it on the
  trajectory (``Trajectory.served_by``).
- ``max_sessions``, ``produces_images`` and the ``prepare(sessions)``/``release()`` hooks of the
  wrapped environment are passed through; ``shutdown()`` stops the actors.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from typing import Any

from ..envs.base import BaseSession, Environment, Reset, Step
from ..errors import ActorDied, ConfigError, EnvironmentError_
from ..placement import Placement
from ..types import Message, Sample
from .channel import Channel
from .connect import actor_death_reason, import_ray, worker_runtime_env
from .env_host import EnvironmentHost

logger = logging.getLogger(__name__)


class RayEnvironmentPool(Environment):
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
        if not isinstance(environment, Environment):
            raise ConfigError(f"environment {name!r} must be a rollforge Environment, got {type(environment).__name__}")
        self.max_sessions = environment.max_sessions
        self.produces_images = environment.produces_images
        self.start_timeout = start_timeout
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "max_concurrency": 100_000,
            "max_restarts": 0,
            "runtime_env": worker_runtime_env(),
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
        #: Each actor's ``ready()`` call, by channel (the node it runs on), and its answer once read;
        #: one entry per actor ever started (a dead one's stay: its sessions may still ask).
        self._ready: dict[Channel, Any] = {}
        self._placements: dict[Channel, Placement] = {}
        self._channels: list[Channel] = [self._start(slot) for slot in range(actors)]
        self._load = [0] * actors
        self._ids = itertools.count()
        self.replacements = 0
        #: Replacements not yet known to run, by slot: their ``ready()`` call (``placed``).
        self._starting: dict[int, Any] = {}

    def _start(self, slot: int) -> Channel:
        channel = Channel(
            self._actor_class.remote(self._shipped), f"{slot} of {self.name!r}", lambda: self._replace(slot, channel)
        )
        self._ready[channel] = channel.actor.ready.remote()
        return channel

    def _replace(self, slot: int, dead: Channel) -> None:
        """Start a new actor in ``slot`` (once per death); it takes new episodes once it runs."""
        if self._channels[slot] is dead:
            self._channels[slot] = self._start(slot)
            self._starting[slot] = self._ready[self._channels[slot]]
            self.replacements += 1
            logger.warning(
                "environment actor %d of %r died; its replacement starts when the cluster can place it, and "
                "new episodes go to the %d running actors until then",
                slot,
                self.name,
                len(self._channels) - len(self._starting),
            )

    def placed(self) -> list[int]:
        """The slots whose actor runs (``running``), or all slots when none does: new episodes then
        wait for whichever starts first."""
        return self.running() or list(range(len(self._channels)))

    def running(self) -> list[int]:
        """The slots whose actor runs, as far as the pool knows without waiting: every slot but
        those of replacements not yet started."""
        if self._starting:
            ray = import_ray()
            started, _ = ray.wait(list(self._starting.values()), num_returns=len(self._starting), timeout=0)
            for slot in [slot for slot, ready in self._starting.items() if ready in started]:
                del self._starting[slot]
                logger.info(
                    "environment actor %d of %r: its replacement runs and takes episodes again", slot, self.name
                )
        return [slot for slot in range(len(self._channels)) if slot not in self._starting]

    # -- Environment protocol -------------------------------------------------------------------
    def open(self, sample: Sample) -> "RemoteSession":
        return RemoteSession(self, self._take(), next(self._ids))

    def _take(self) -> int:
        """The running slot with the fewest live sessions, counted one more."""
        slot = min(self.placed(), key=self._load.__getitem__)
        self._load[slot] += 1
        return slot

    async def prepare(self, sessions: int) -> None:
        """Wait until every actor runs (bounded by ``start_timeout``; an actor that dies while
        starting is replaced), then give each its share of the sessions for the wrapped
        environment's own ``prepare``."""
        try:
            async with asyncio.timeout(self.start_timeout):
                await asyncio.gather(*(self._started(slot) for slot in range(len(self._channels))))
        except TimeoutError:
            raise ConfigError(
                f"environment actors of {self.name!r} did not start within {self.start_timeout}s; does the "
                "cluster have the CPUs and memory they reserve?"
            ) from None
        share = math.ceil(sessions / len(self._channels))
        images = await asyncio.gather(*(channel.actor.prepare.remote(share) for channel in self._channels))
        self.produces_images = any(images)

    async def _started(self, slot: int, attempts: int = 3) -> None:
        ray = import_ray()
        for attempt in range(attempts):
            channel = self._channels[slot]
            try:
                await channel.actor.ready.remote()  # asked again: an actor that ran may have died since
                return
            except ray.exceptions.RayActorError as exc:
                if attempt == attempts - 1:
                    raise EnvironmentError_(
                        f"environment actor {slot} of {self.name!r} died {attempts} times while starting: {actor_death_reason(exc)}"
                    ) from None
                self._replace(slot, channel)

    async def release(self) -> None:
        """The wrapped environment's ``release`` on every running actor (a replacement the cluster
        never placed holds nothing, and a call to it would wait for a placement that never comes)."""
        running = [self._channels[slot] for slot in self.running()]
        await asyncio.gather(*(c.actor.release.remote() for c in running), return_exceptions=True)

    def shutdown(self) -> None:
        ray = import_ray()
        for channel in self._channels:
            ray.kill(channel.actor)

    # -- used by sessions and tests ----------------------------------------------------------------
    def channel(self, slot: int) -> Channel:
        return self._channels[slot]

    def actor(self, slot: int) -> Any:
        return self._channels[slot].actor

    async def placement(self, slot: int, channel: Channel) -> Placement | None:
        """Where ``channel`` (an actor of ``slot``) runs, read from its ``ready()`` once; None when it
        died before answering."""
        known = self._placements.get(channel)
        if known is None:
            try:
                node, host = await self._ready[channel]
            except import_ray().exceptions.RayActorError:
                return None
            known = self._placements[channel] = Placement(f"{self.name}/{slot}", node, host)
        return known

    def done(self, slot: int) -> None:
        self._load[slot] -= 1

    def move(self, slot: int) -> int:
        """Another slot for a session that held nothing on ``slot``'s dead actor."""
        self.done(slot)
        return self._take()


class RemoteSession(BaseSession):
    """The driver's side of one episode on an environment actor."""

    def __init__(self, pool: RayEnvironmentPool, slot: int, sid: int):
        self._pool, self._slot, self._sid = pool, slot, sid
        self._channel = pool.channel(slot)
        self._sent = 0
        self._metadata: Any = None
        self._handle: Any = None
        self._remote_open = True
        self._close_error: Exception | None = None
        self._closed = False
        self._placement: Placement | None = None

    async def reset(self, sample: Sample) -> Reset:
        self._placement = await self._pool.placement(self._slot, self._channel)
        try:
            return await self._call("reset", sample)
        except ActorDied:  # held nothing yet: start again on a running actor
            self._slot = self._pool.move(self._slot)
            self._channel = self._pool.channel(self._slot)
            self._placement = await self._pool.placement(self._slot, self._channel)
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
            with contextlib.suppress(ActorDied):  # its sessions died with it
                await self._call("close")

    @property
    def metadata(self) -> Any:
        return self._metadata

    @property
    def handle(self) -> Any:
        return self._handle

    @property
    def placement(self) -> Placement | None:
        """The actor that holds this session and its node (known from ``reset`` on, whether the
        environment's ``reset`` succeeded or raised)."""
        return self._placement

    def _call(self, method: str, *args: Any) -> asyncio.Future:
        return self._channel.call(method, self._sid, *args)
