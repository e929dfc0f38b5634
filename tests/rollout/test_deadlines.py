"""deadline(): asyncio.timeout's behaviour on shared, coarse timers (never early, at most a tick late).

A block that should time out awaits something that would otherwise last ``HANG_SECONDS``: only the
limit ends it, so a limit that never fires fails the test instead of hanging it. A tick's passing is
observed as a later limit expiring (timers fire in order), not by sleeping for it."""

import asyncio

import pytest

from rollforge.rollout.deadlines import RESOLUTION, deadline
from rollforge.testing import HANG_SECONDS


async def test_a_block_past_its_limit_raises_timeout_error_and_says_so():
    loop = asyncio.get_running_loop()
    started = loop.time()  # the clock the limits are set on
    limit = deadline(0.05)
    with pytest.raises(TimeoutError):
        async with limit:
            await asyncio.sleep(HANG_SECONDS)
    assert limit.expired()
    assert loop.time() - started >= 0.05  # never early


async def test_a_block_within_its_limit_is_untouched_and_its_timer_does_not_fire_later():
    limit = deadline(0.05)
    async with limit:
        await asyncio.sleep(0)
    later = deadline(0.05 + RESOLUTION)  # ends on a later tick than ``limit``
    with pytest.raises(TimeoutError):
        async with later:
            await asyncio.sleep(HANG_SECONDS)
    assert later.expired() and not limit.expired()  # its tick passed first: nothing was cancelled


async def test_no_limit_and_many_limits_on_one_tick():
    async with deadline(None) as unlimited:
        await asyncio.sleep(0)
    assert not unlimited.expired()

    async def one(i: int) -> str:
        try:
            async with deadline(0.02):
                await asyncio.sleep(0 if i % 2 else HANG_SECONDS)
            return "done"
        except TimeoutError:
            return "timeout"

    results = await asyncio.gather(*(one(i) for i in range(200)))
    assert results.count("done") == 100 and results.count("timeout") == 100


async def test_an_outer_cancellation_is_not_turned_into_a_timeout():
    entered = asyncio.Event()

    async def body():
        async with deadline(10):
            entered.set()
            await asyncio.sleep(HANG_SECONDS)

    task = asyncio.ensure_future(body())
    await asyncio.wait_for(entered.wait(), HANG_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_nested_limits_the_inner_one_expires_first():
    with pytest.raises(TimeoutError):
        async with deadline(10) as outer:
            async with deadline(0.02) as inner:
                await asyncio.sleep(HANG_SECONDS)
    assert inner.expired() and not outer.expired()


async def test_a_pending_timer_does_not_keep_the_callers_context_alive():
    """The first limit of a tick schedules the shared timer; the caller's context variables (an
    episode's state, which a router's placements watch) must not live until that timer fires."""
    import contextvars
    import gc
    import weakref

    held = contextvars.ContextVar("held")

    class State:
        pass

    async def episode() -> weakref.ref:
        state = State()
        held.set(state)
        async with deadline(600):  # a timer ten minutes away
            await asyncio.sleep(0)
        return weakref.ref(state)

    ref = await asyncio.ensure_future(episode())  # its own task, with its own copy of the context
    await asyncio.sleep(0)
    gc.collect()
    assert ref() is None


async def test_limits_that_end_early_leave_no_timer_on_the_loop():
    """An episode's 30-minute limit that its episode outlives by far must not keep a timer (and the
    tick's dict) on the loop for 30 minutes: 100,000 episodes grew memory 13% that way (the soak)."""
    loop = asyncio.get_running_loop()

    def live_timers() -> int:
        return sum(not handle.cancelled() for handle in loop._scheduled)  # asyncio's timer heap

    before = live_timers()
    for i in range(200):
        async with deadline(1800.0 + i):  # each on a tick of its own
            await asyncio.sleep(0)
    assert live_timers() == before
    async with deadline(1800.0):  # an open limit keeps its timer
        assert live_timers() == before + 1
    assert live_timers() == before
