"""rollforge's own worker threads (rollforge.workers). The tests wait on events and assert counts;
a bounded wait (``wait_until``, ``wait_finished``) only catches a hang."""

from __future__ import annotations

import asyncio
import threading
import traceback

import pytest

from rollforge.testing import HANG_SECONDS, wait_until
from rollforge.workers import Workers


def blocker(loop: asyncio.AbstractEventLoop, started: asyncio.Event, release: threading.Event):
    """A call that tells the loop it has started on its thread, then blocks until released."""

    def call() -> str:
        loop.call_soon_threadsafe(started.set)
        release.wait()
        return "released"

    return call


async def test_every_waiting_call_gets_its_own_thread():
    pool = Workers("test-grow", idle_seconds=0.2)
    barrier = threading.Barrier(40, timeout=HANG_SECONDS)  # passes only if 40 calls run at the same time

    results = await asyncio.gather(*(pool.run(barrier.wait) for _ in range(40)))
    assert sorted(results) == list(range(40)) and pool.threads == 40
    assert await asyncio.to_thread(wait_until, lambda: pool.threads == 0)  # idle threads retire


async def test_idle_threads_are_reused():
    pool = Workers("test-reuse")
    names = [await pool.run(lambda: threading.current_thread().name) for _ in range(5)]
    assert names == ["test-reuse-0"] * 5 and pool.threads == 1


async def test_a_cancelled_call_is_abandoned_not_joined_and_counted_until_it_ends():
    pool = Workers("test-abandon")
    started, release = asyncio.Event(), threading.Event()
    call = asyncio.ensure_future(pool.run(blocker(asyncio.get_running_loop(), started, release)))
    await asyncio.wait_for(started.wait(), HANG_SECONDS)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):  # returns while the call still blocks: not joined
        await asyncio.wait_for(call, HANG_SECONDS)
    assert not release.is_set() and pool.running == 1 and pool.abandoned == 1
    assert await pool.run(lambda: "a new thread serves the next call") == "a new thread serves the next call"
    assert pool.threads == 2
    release.set()
    assert await asyncio.to_thread(pool.wait_finished, HANG_SECONDS) == 0
    assert pool.abandoned == 0
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test-abandon"))


async def test_exceptions_keep_the_raising_frame():
    def fails():
        raise KeyError("from the worker")

    pool = Workers("test-raise")
    with pytest.raises(KeyError) as info:
        await pool.run(fails)
    assert traceback.extract_tb(info.value.__traceback__)[-1].name == "fails"


def test_a_result_for_a_closed_loop_is_dropped():
    pool = Workers("test-closed")
    release = threading.Event()

    async def leave_a_call_running():
        started = asyncio.Event()
        task = asyncio.ensure_future(pool.run(blocker(asyncio.get_running_loop(), started, release)))
        await asyncio.wait_for(started.wait(), HANG_SECONDS)
        task.cancel()

    asyncio.run(leave_a_call_running())  # the loop closes while the call still runs
    assert pool.abandoned == 1
    release.set()
    assert pool.wait_finished(HANG_SECONDS) == 0
    assert pool.abandoned == 0  # the worker finished and dropped its result quietly
