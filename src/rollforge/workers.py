"""Worker threads rollforge owns for blocking user code: sync tools, resets, step-style ``step``
calls, sync reward functions, blocking client libraries.

Why not ``asyncio.to_thread``: asyncio's default executor has ``min(32, cpus + 4)`` workers (6 on a
2-core machine), so a handful of episodes hanging in a sync tool starve every other episode, and
``asyncio.run`` joins its threads at shutdown, so one hung tool makes the program never exit.
``concurrent.futures.ThreadPoolExecutor`` has the same join at interpreter exit (an ``atexit``
hook). This pool holds by construction instead:

- **Sized for the concurrency**: a call that finds no idle worker starts a new thread, so every
  episode waiting on blocking code has its own thread; idle threads exit after ``idle_seconds``.
  The engine's concurrency bounds the calls in flight, hence the threads.
- **Stuck workers are abandoned, never joined**: threads are daemons and nothing joins them; a
  caller that stops waiting (the engine's step timeout cancels it) leaves its worker to finish or
  hang on its own, counted in ``abandoned``. Its replacement is simply the next thread started.
- **The policy update never shares them**: ``train/run.py`` runs it on ``UPDATE_WORKERS``.
- **No call is cut off inside native code at exit**: Python 3.11 ends a daemon thread that wakes
  during finalization with ``pthread_exit``, which aborts the process (SIGABRT, "terminate called
  without an active exception") when the thread is inside torch. An ``atexit`` hook therefore
  waits, up to each pool's ``exit_grace`` seconds, for the calls still running (an interrupted
  policy update, an abandoned tool); a second Ctrl-C stops the wait.

``run_sync`` is the one way rollforge's synchronous façades (``rollout``, ``train``, ``sft``,
``check_env``) run their coroutine: ``asyncio.run`` normally; inside a running event loop (a
notebook cell) on a fresh loop in a helper thread, whose task a Ctrl-C cancels.

Results travel back with ``call_soon_threadsafe``; a loop closed meanwhile is ignored. Exceptions
keep their traceback, so ``boundary.is_own_bug`` can tell the user's code from rollforge's.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import queue
import threading
import time
import weakref
from typing import Any, Callable, Coroutine, TypeVar

from .boundary import call_user

T = TypeVar("T")
logger = logging.getLogger(__name__)


class _Job:
    __slots__ = ("function", "args", "kwargs", "loop", "future", "running", "abandoned")

    def __init__(self, function, args, kwargs, loop, future):
        self.function, self.args, self.kwargs, self.loop, self.future = function, args, kwargs, loop, future
        self.running = False
        self.abandoned = False


class Workers:
    """A pool of daemon threads that grows on demand (see the module docstring). ``exit_grace``:
    how long the exiting process waits for this pool's running calls."""

    def __init__(self, name: str, idle_seconds: float = 10.0, exit_grace: float = 10.0):
        self.name = name
        self.idle_seconds = idle_seconds
        self.exit_grace = exit_grace
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)  # notified whenever a call ends
        self._idle = 0  # threads waiting for a job that no submitted job has claimed yet
        self._threads = 0
        self._running = 0
        self._abandoned = 0
        self._ids = itertools.count()
        _POOLS.add(self)

    @property
    def threads(self) -> int:
        """Threads alive now (busy, idle or abandoned)."""
        return self._threads

    @property
    def running(self) -> int:
        """Calls running now, abandoned ones included."""
        return self._running

    def wait_finished(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the running calls to end; return how many still run."""
        with self._finished:
            self._finished.wait_for(lambda: self._running == 0, timeout)
            return self._running

    @property
    def abandoned(self) -> int:
        """Calls still running whose caller stopped waiting (a hung tool after its step timeout)."""
        return self._abandoned

    async def run(self, function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``function(*args, **kwargs)`` on a worker thread and await its result. Cancelling
        the caller abandons the call: its thread is left to finish on its own."""
        loop = asyncio.get_running_loop()
        job = _Job(function, args, kwargs, loop, loop.create_future())
        self._submit(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            with self._lock:
                if job.running:
                    job.abandoned = True
                    self._abandoned += 1
            if job.abandoned:
                logger.warning(
                    "%s: a call to %s was abandoned while still running (%d abandoned so far); its "
                    "thread is left to finish on its own",
                    self.name,
                    _describe(function),
                    self._abandoned,
                )
            raise

    def _submit(self, job: _Job) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
                start = False
            else:
                self._threads += 1
                start = True
            self._jobs.put(job)
        if start:
            threading.Thread(target=self._work, name=f"{self.name}-{next(self._ids)}", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle and self._jobs.empty():  # nobody claimed this thread: retire it
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            self._execute(job)

    def _execute(self, job: _Job) -> None:
        """Run one job; the thread counts as idle again before the result is delivered, so the
        caller's next call reuses it."""
        with self._lock:
            if job.future.cancelled():  # the caller gave up before the call started
                self._idle += 1
                return
            job.running = True
            self._running += 1
        result, error = None, None
        try:
            result = call_user(job.function, *job.args, **job.kwargs)
        except BaseException as exc:  # delivered to the caller, who decides what it means
            error = exc
        with self._lock:
            job.running = False
            if job.abandoned:
                self._abandoned -= 1
            self._idle += 1
            self._running -= 1
            self._finished.notify_all()
        try:
            job.loop.call_soon_threadsafe(_deliver, job.future, result, error)
        except RuntimeError:  # the loop is closed: nobody waits for this result
            pass
        del job, result, error  # no reference cycles through the traceback while idle


def _deliver(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _describe(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


_POOLS: "weakref.WeakSet[Workers]" = weakref.WeakSet()


@atexit.register
def _finish_at_exit() -> None:
    """Wait for the calls still running (see the module docstring), each pool up to its grace."""
    began = time.monotonic()
    try:
        for pool in list(_POOLS):
            if pool.running:
                logger.warning(
                    "%s: waiting up to %.0fs for %d running call(s) to finish before exit",
                    pool.name,
                    pool.exit_grace,
                    pool.running,
                )
                pool.wait_finished(max(0.0, began + pool.exit_grace - time.monotonic()))
    except KeyboardInterrupt:  # the user does not want to wait
        pass


#: Environment and reward work: sync tools, resets, steps, reward functions, blocking clients.
ENVIRONMENT_WORKERS = Workers("rollforge-env", exit_grace=5.0)

#: The policy update (forward, backward, optimizer step): never shares a thread with user code.
UPDATE_WORKERS = Workers("rollforge-update", idle_seconds=300.0, exit_grace=300.0)

#: rollforge's own CPU work moved off the event loop (tokenizing long observations); never user code.
RENDER_WORKERS = Workers("rollforge-render", idle_seconds=60.0)


async def run_blocking(function: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run blocking environment or reward code on ``ENVIRONMENT_WORKERS``."""
    return await ENVIRONMENT_WORKERS.run(function, *args, **kwargs)


def run_sync(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion from synchronous code (see the module docstring)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the usual script
        return asyncio.run(main)
    return _run_in_helper_thread(main)


def _run_in_helper_thread(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a helper thread; a KeyboardInterrupt here cancels it there.
    (Waits on an Event: an interrupted ``Thread.join`` marks a running thread as stopped.)"""
    started, finished = threading.Event(), threading.Event()
    running: list = []  # (loop, task), set by the helper thread: a Ctrl-C in this one cannot lose it
    outcome: list = []

    async def runner() -> T:
        running.append((asyncio.get_running_loop(), asyncio.current_task()))
        started.set()
        return await main

    def run() -> None:
        try:
            outcome.append((True, asyncio.run(runner())))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append((False, exc))
        finally:
            finished.set()

    threading.Thread(target=run, name="rollforge-run-sync", daemon=True).start()
    try:  # a Ctrl-C as early as while the coroutine starts cancels it too
        while not finished.wait(0.1):  # short waits, so that Ctrl-C reaches this thread
            pass
    except KeyboardInterrupt:
        while not (started.is_set() or finished.is_set()):
            started.wait(0.1)
        if running:
            loop, task = running[0]
            loop.call_soon_threadsafe(task.cancel)
        finished.wait()
        raise
    ok, value = outcome[0]
    if ok:
        return value
    raise value
