"""One engine worker process (``engine_workers.py``, ``worker_pool.py``): loads the pool's setup
once (environments, tokenizer or a vision model's processor, backend), then runs each rollout's
shard with ``run_checked`` on its own event loop and sends the trajectories back as their episodes
end (those that end in one loop iteration in one pickle).

It generates with its own copy of the backend when the backend has a ``reopener``, else through
``_ProxyBackend``, which sends each request to the rollout's process. It ignores SIGINT (the parent
stops it), stops when the parent's socket closes, and leaves with ``os._exit`` once everything is
sent: interpreter teardown can hang on a library's native threads, and nothing is left to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import resource
import signal
import socket
import sys
import weakref
from dataclasses import replace
from typing import Any, Sequence

from ..backends.base import CURRENT_EPISODE, Backend, SamplingParams
from ..chat.render import ChatRenderer
from ..chat.vision import VisionRenderer
from ..errors import ConfigError
from ..types import Completion, Trajectory
from .engine import run_checked
from .worker_channel import Channel, IterationBatch, Setup, Shard, dumps, loads, portable_error

logger = logging.getLogger(__name__)
#: Seconds a worker whose parent has gone waits for its episodes to unwind before it exits anyway.
_EXIT_GRACE = 5.0


class _ProxyBackend(Backend):
    """Generation by the parent process's backend, over the channel. Each request names its episode
    (a number per ``CURRENT_EPISODE`` object, ``ended`` when that object dies), so that a router
    there keeps every turn of an episode on one replica."""

    def __init__(self, channel: Channel, accepts_images: bool):
        self.accepts_images = accepts_images
        self._channel = channel
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self._episodes: dict[int, int] = {}  # id(CURRENT_EPISODE object) -> its number
        self.active = False  # a rollout runs: between rollouts a worker sends nothing

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, images: Any = None) -> Completion:
        request = next(self._ids)
        future = self._pending[request] = asyncio.get_running_loop().create_future()
        self._channel.send(("generate", request, self._episode(), list(prompt_ids), params, images))
        try:
            return await future
        except asyncio.CancelledError:
            if not future.done():
                self._channel.send(("cancel", request))
            raise
        finally:
            del self._pending[request]

    def _episode(self) -> int | None:
        episode = CURRENT_EPISODE.get()
        if episode is None:
            return None
        number = self._episodes.get(id(episode))
        if number is None:
            try:
                weakref.finalize(episode, self._ended, id(episode), number := next(self._ids))
            except TypeError:  # not weakly referenceable: no lifetime to follow, no placement
                return None
            self._episodes[id(episode)] = number
        return number

    def _ended(self, key: int, number: int) -> None:
        del self._episodes[key]
        if not self.active:  # collected between rollouts: the parent's episodes ended with them
            return
        with contextlib.suppress(RuntimeError):  # collected after the loop closed: nothing to tell
            self._channel.send(("ended", number))

    def answer(self, request: int, completion: Completion | None, error: BaseException | None) -> None:
        future = self._pending.get(request)
        if future is not None and not future.done():
            future.set_result(completion) if error is None else future.set_exception(error)


def worker_main(fd: int) -> None:
    """A worker process's entry point: serve the pool on socket ``fd`` until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops its workers
    asyncio.run(_serve(socket.socket(fileno=fd)))
    # everything is sent and the environments released (see the module docstring)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


async def _serve(sock: socket.socket) -> None:
    channel = await Channel.open(sock)
    try:
        worker = await _Worker.set_up(channel)
        if worker is not None:
            await worker.serve()
    finally:
        await channel.close()


def _unpickled(payload: bytes, what: str) -> Any:
    try:
        return loads(payload)
    except Exception as exc:
        raise ConfigError(
            f"an engine worker could not load {what} ({type(exc).__name__}: {exc}); environment classes "
            "and factories must be importable: define them in a module, not in the script that runs"
        ) from None


class _Worker:
    """A worker's life: its setup once (the pool's), then rollouts one at a time, until its socket
    closes. Its backend (the proxy, or its own copy) and renderer serve every rollout."""

    def __init__(self, channel: Channel, setup: Setup):
        self.channel, self.task_to_env = channel, setup.task_to_env
        self.proxy = _ProxyBackend(channel, setup.accepts_images)
        self.backend = self.proxy if setup.opener is None else setup.opener()
        self.renderer = _renderer(setup)
        self.rolling: asyncio.Future | None = None

    @classmethod
    async def set_up(cls, channel: Channel) -> "_Worker | None":
        """The worker once its setup has arrived and loaded (``ready`` sent, with the CPU seconds
        its start took), or None (the reason sent as ``raised``)."""
        try:
            ((_, payload),) = await channel.receive()
            worker = cls(channel, _unpickled(payload, "the environments and tokenizer"))
        except EOFError:
            return None
        except Exception as exc:
            channel.send(("raised", portable_error(exc)))
            return None
        started = resource.getrusage(resource.RUSAGE_SELF)  # the interpreter, imports, setup and renderer
        channel.send(("ready", started.ru_utime + started.ru_stime))
        return worker

    async def serve(self) -> None:
        try:
            while True:
                try:
                    messages = await self.channel.receive()
                except EOFError:  # the pool closed, or the parent has gone: stop, even if episodes do not unwind
                    if self.rolling is not None:
                        self.rolling.cancel()
                        asyncio.get_running_loop().call_later(_EXIT_GRACE, os._exit, 1)
                        await asyncio.gather(self.rolling, return_exceptions=True)
                    return
                for kind, *rest in messages:
                    if kind == "shard":
                        self.rolling = asyncio.ensure_future(self._roll(rest[0]))
                    else:  # a completion
                        self.proxy.answer(*rest)
        finally:
            await self.backend.close()

    async def _roll(self, payload: bytes) -> None:
        """One rollout's shard; ``done`` (or ``raised``) is its last message: nothing is sent
        between rollouts."""
        finished = Finished(self.channel)
        self.proxy.active = True
        try:
            shard: Shard = _unpickled(payload, "the rollout's samples")
            result = await run_checked(
                shard.samples, self.task_to_env, self.backend, self.renderer, shard.config, on_episode=finished.add
            )  # the rollout's process checked them
            self.channel.send(("done", result.metrics["abandoned_worker_calls"]))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # what a one-process rollout would raise: raised in the parent
            self.channel.send(("raised", portable_error(exc)))
        finally:
            self.proxy.active, self.rolling = False, None


def _renderer(setup: Setup) -> ChatRenderer:
    """The parent's renderer again: a ``VisionRenderer`` of its processor (the same image expansions,
    so the same ids), else a ``ChatRenderer`` of its tokenizer."""
    if setup.processor is None:
        return ChatRenderer(setup.tokenizer, setup.family, keep_reasoning=setup.keep_reasoning)
    return VisionRenderer(setup.processor, setup.family, keep_reasoning=setup.keep_reasoning)


class Finished(IterationBatch):
    """Trajectories that ended in one loop iteration, sent as one ``episodes`` message at its end:
    one pickle for all of them (shared memo, one call)."""

    def __init__(self, channel: Channel):
        super().__init__(functools.partial(_send_episodes, channel))


def _send_episodes(channel: Channel, trajectories: list[Trajectory]) -> None:
    try:
        blob = dumps(trajectories)
    except Exception:  # one that does not pickle costs the others nothing
        blob = dumps([portable for trajectory in trajectories if (portable := _portable(trajectory))])
    channel.send(("episodes", blob))


def _portable(trajectory: Trajectory) -> Trajectory | None:
    """The trajectory; without its environment handle when that does not pickle; None (logged: the
    rollout's process records the episode as lost) when it still does not."""
    for candidate in (trajectory, replace(trajectory, environment=None)):
        try:
            dumps(candidate)
            return candidate
        except Exception as exc:
            error = exc
    logger.warning(
        "episode %d's trajectory does not pickle (%s: %s); it cannot leave this engine worker",
        trajectory.index,
        type(error).__name__,
        error,
    )
    return None
