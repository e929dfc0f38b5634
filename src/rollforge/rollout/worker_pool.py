"""Engine worker processes that start once and serve many rollouts (``EngineWorkers``).

A worker's start (a fresh interpreter, rollforge's imports, then unpickling the renderer's
tokenizer, which imports transformers: about 1.5 s of CPU, see ``engine_workers.py``) is paid once
per pool, not once per rollout. A training run opens one pool for all its steps.

Design:

- A pool is opened for one ``(task_to_env, backend, renderer)``. Each worker is started and sent the
  ``Setup`` once (the environments, the tokenizer and chat family, a ``VisionRenderer``'s processor
  so that the worker renders images as it does, how it generates: the backend's ``reopener`` when it
  pickles, else through this process); it answers ``ready`` with the CPU
  seconds its start took, then serves rollouts one at a time, each sent only its ``Shard`` (its
  samples, and the config with ``first_index`` and its share of ``concurrency``).
- The workers hold copies made when the pool opened: a rollout must pass the same environment
  objects under the same names, the same backend and the same renderer (``check``); anything else is
  refused in one line. An environment object changed since the pool opened is not seen: open a
  new pool.
- A rollout wraps each worker's socket, duplicated, in a ``Channel`` on its own event loop and
  closes that at its end, so one pool serves rollouts on different loops (the sync ``rollout()``
  runs each in a loop of its own). A worker sends nothing between rollouts (``done`` is its last
  message), so no frame is split between two rollouts' readers.
- A worker that died (in a rollout: only its unfinished episodes fail; or between rollouts) is
  started again, logged, when the next rollout begins; the others keep running. A rollout that
  raises or is cancelled (Ctrl-C) closes the pool: every worker is terminated, and a later rollout
  on it is refused in one line. One rollout at a time: a second one while the first runs is refused.
- ``close()`` closes the sockets: each worker exits when it sees its socket close; one still
  running ``_EXIT_GRACE`` seconds later is terminated, then killed. A parent that vanishes closes
  them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Mapping

from ..backends.base import Backend
from ..chat.vision import VisionRenderer
from ..errors import ConfigError
from ..workers import run_sync
from .worker_channel import Channel, Setup, dumps

logger = logging.getLogger(__name__)
#: Seconds a worker may take to exit after its socket closed, and after SIGTERM, before SIGKILL.
_EXIT_GRACE = 5.0


@dataclass
class PoolWorker:
    """One worker process of a pool, as this process sees it."""

    number: int
    process: Any
    sock: socket.socket  # this end of its socket pair
    start_cpu: float | None = None  # CPU seconds it took to be ready (interpreter, imports, setup)
    rollouts: int = 0  # rollouts it has served


class EngineWorkers:
    """``count`` engine worker processes for rollouts of ``task_to_env`` with ``backend`` and
    ``renderer`` (see the module docstring). Open with ``async with`` (or ``with``, or ``await
    open()``), pass as ``arollout(..., workers=pool)``, close with ``close()`` / ``aclose()``."""

    def __init__(self, count: int, task_to_env: Mapping[str, Any], backend: Backend, renderer: Any):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(
                f"EngineWorkers(count={count!r}): expected a whole number of worker processes, at least 1"
            )
        self.count = count
        self._served = (dict(task_to_env), backend, renderer)
        self._setup = _setup_payload(task_to_env, backend, renderer, count)  # a refusal before any process
        self._workers: list[PoolWorker] = []
        self._closed = self._busy = False
        self.setups_sent = 0  # one per worker started: a rollout sends only its shard

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    @property
    def start_cpu_seconds(self) -> list[float | None]:
        """Each worker's CPU seconds before it was ready (None: it never was)."""
        return [worker.start_cpu for worker in self._workers]

    async def open(self) -> "EngineWorkers":
        """Start every worker and wait until each is ready."""
        if self._workers or self._closed:
            raise ConfigError("these EngineWorkers were opened already; a pool is opened once (open a new one)")
        self._workers = [_spawn(number) for number in range(self.count)]
        try:
            await asyncio.gather(*(self._set_up(worker) for worker in self._workers))
        except BaseException:
            await self.aclose()
            raise
        return self

    async def aclose(self) -> None:
        self._closed = True
        await stop(self._workers)

    def close(self) -> None:
        run_sync(self.aclose())

    async def __aenter__(self) -> "EngineWorkers":
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> "EngineWorkers":
        return run_sync(self.open())

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check(self, task_to_env: Mapping[str, Any], backend: Backend, renderer: Any, engine_workers: int) -> None:
        """Refuse, in one line, a rollout this pool cannot serve."""
        if self._closed or not self._workers:
            raise ConfigError(
                "these EngineWorkers are not open (closed, never opened, or a rollout on them raised "
                "or was cancelled); open a new pool"
            )
        if self._busy:
            raise ConfigError(
                "these EngineWorkers are serving another rollout; a pool serves one rollout at a time "
                "(await it first, or open a pool for each)"
            )
        if engine_workers not in (1, self.count):
            raise ConfigError(
                f"engine_workers={engine_workers} but the pool given (workers=) has {self.count} "
                f"workers; leave engine_workers at 1 or set it to {self.count}"
            )
        envs, served_backend, served_renderer = self._served
        differ = [
            name
            for name, same in (
                ("task_to_env", envs.keys() == task_to_env.keys() and all(envs[k] is task_to_env[k] for k in envs)),
                ("backend", served_backend is backend),
                ("renderer", served_renderer is renderer),
            )
            if not same
        ]
        if differ:
            raise ConfigError(
                f"these EngineWorkers were opened for another {' and '.join(differ)}: the workers hold copies of the "
                "environments, backend and renderer the pool was opened with; pass those, or open a pool for these"
            )

    @contextlib.asynccontextmanager
    async def lease(self, count: int) -> AsyncIterator[list[tuple[PoolWorker, Channel]]]:
        """The first ``count`` workers (dead ones started again first), each with a channel on this
        event loop, for one rollout; if the rollout raises or is cancelled, the pool is closed."""
        channels: list[Channel] = []
        failed, self._busy = True, True
        try:
            await self._revive(self._workers[:count])
            for worker in self._workers[:count]:
                channels.append(await Channel.open(worker.sock.dup()))
            yield list(zip(self._workers[:count], channels))
            failed = False
        finally:
            for channel in channels:
                with contextlib.suppress(Exception):
                    await channel.close()
            for worker in self._workers[:count]:
                worker.rollouts += 1
            self._busy = False
            if failed:
                await self.aclose()

    async def _revive(self, workers: list[PoolWorker]) -> None:
        """Start again, in its place, each of ``workers`` that has exited."""
        dead = [worker for worker in workers if worker.process.poll() is not None]
        for worker in dead:
            logger.warning(
                "engine worker %d (pid %d) exited with code %s; starting it again",
                worker.number,
                worker.process.pid,
                worker.process.returncode,
            )
            await stop([worker])
            self._workers[worker.number] = _spawn(worker.number)
        await asyncio.gather(*(self._set_up(self._workers[worker.number]) for worker in dead))

    async def _set_up(self, worker: PoolWorker) -> None:
        channel = await Channel.open(worker.sock.dup())
        try:
            channel.send(("setup", self._setup))
            self.setups_sent += 1
            try:
                ((kind, value),) = await channel.receive()
            except EOFError:
                await stop([worker])
                raise ConfigError(
                    f"engine worker {worker.number} (pid {worker.process.pid}) exited with code "
                    f"{worker.process.returncode} before it was ready"
                ) from None
            if kind == "raised":
                raise value
            worker.start_cpu = value
        finally:
            await channel.close()


def _setup_payload(task_to_env: Mapping[str, Any], backend: Backend, renderer: Any, count: int) -> bytes:
    family = renderer.family
    keep_reasoning = bool(family.keep_reasoning) and renderer.template_kwargs == {
        **family.template_kwargs,
        **family.keep_reasoning,
    }
    processor = renderer.processor if isinstance(renderer, VisionRenderer) else None  # images rendered there too
    setup = Setup(
        dict(task_to_env),
        renderer.tokenizer,
        family,
        keep_reasoning,
        backend.accepts_images,
        _opener(backend),
        processor,
    )
    return pickled(setup, f"engine_workers={count}")


def pickled(payload: Any, setting: str) -> bytes:
    """``payload`` pickled for the workers, or the one-line refusal naming ``setting``."""
    try:
        return dumps(payload)
    except Exception as exc:
        raise ConfigError(
            f"{setting} sends the samples, environments and tokenizer (or processor) to worker processes, but "
            f"they do not pickle ({type(exc).__name__}: {exc}); define environment classes at a module's top "
            "level, or set engine_workers=1"
        ) from None


def _opener(backend: Backend) -> Callable[[], Backend] | None:
    """The backend's reopener when it pickles; otherwise workers send their requests here."""
    opener = backend.reopener()
    if opener is not None:
        try:
            dumps(opener)
        except Exception as exc:
            logger.warning(
                "%s cannot be reopened in the engine workers (%s: %s); their requests come to this process instead",
                type(backend).__name__,
                type(exc).__name__,
                exc,
            )
            return None
    return opener


def _spawn(number: int) -> PoolWorker:
    """A fresh interpreter (not a fork, and not multiprocessing's spawn, which re-runs the
    caller's script), given this one's import path."""
    child_end, parent_end = socket.socketpair()
    code = (
        f"import sys; sys.path[:0] = {sys.path!r}; "
        f"from rollforge.rollout.worker_process import worker_main; worker_main({child_end.fileno()})"
    )
    with child_end:
        process = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child_end.fileno(),))
    return PoolWorker(number, process, parent_end)


async def stop(workers: list[PoolWorker]) -> None:
    """Every worker gone: its socket closed; those still running after a grace period are
    terminated, then killed."""
    for worker in workers:
        worker.sock.close()
    for signal_them in (None, "terminate", "kill"):
        running = [w.process for w in workers if w.process.poll() is None]
        if not running:
            return
        for process in running if signal_them else ():
            getattr(process, signal_them)()
        deadline = time.monotonic() + _EXIT_GRACE
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
