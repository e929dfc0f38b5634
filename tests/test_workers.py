"""rollforge's own worker threads (rollforge.workers)."""

from __future__ import annotations

import asyncio
import threading
import time
import traceback

import pytest

from rollforge.workers import Workers


async def test_every_waiting_call_gets_its_own_thread():
    pool = Workers("test-grow", idle_seconds=0.2)
    barrier = threading.Barrier(40, timeout=5)  # passes only if 40 calls run at the same time

    results = await asyncio.gather(*(pool.run(barrier.wait) for _ in range(40)))
    assert sorted(results) == list(range(40)) and pool.threads == 40
    for _ in range(100):  # idle threads retire
        if pool.threads == 0:
            break
        await asyncio.sleep(0.05)
    assert pool.threads == 0


async def test_idle_threads_are_reused():
    pool = Workers("test-reuse")
    names = [await pool.run(lambda: threading.current_thread().name) for _ in range(5)]
    assert names == ["test-reuse-0"] * 5 and pool.threads == 1


async def test_a_cancelled_call_is_abandoned_not_joined_and_counted_until_it_ends():
    pool = Workers("test-abandon")
    release = threading.Event()
    call = asyncio.ensure_future(pool.run(release.wait))
    await asyncio.sleep(0.05)
    started = time.perf_counter()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert time.perf_counter() - started < 0.1 and pool.abandoned == 1
    assert await pool.run(lambda: "a new thread serves the next call") == "a new thread serves the next call"
    assert pool.threads == 2
    release.set()
    for _ in range(100):
        if pool.abandoned == 0:
            break
        await asyncio.sleep(0.01)
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
        task = asyncio.ensure_future(pool.run(release.wait))
        await asyncio.sleep(0.05)
        task.cancel()

    asyncio.run(leave_a_call_running())  # the loop closes while the call still runs
    release.set()
    for _ in range(100):
        if pool.abandoned == 0:
            break
        time.sleep(0.01)
    assert pool.abandoned == 0  # the worker finished and dropped its result quietly
