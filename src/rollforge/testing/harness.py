"""What tests ask of the machine: a bounded wait for a condition.

Tests synchronise on events and assert counts and orders, never durations. Where no event exists
to wait on (another process exits, a thread retires after its idle time, Ray frees an actor's
CPUs), ``wait_until`` polls the condition until it holds or ``timeout`` passes, and returns
whether it held; ``until`` is the same on an event loop, for conditions only the loop's thread may
read. Their timeout only catches a hang: it is generous (30 s by default) and a test asserts the
returned bool, never how long the wait took.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

#: How long ``wait_until`` waits by default: long enough for a loaded machine, short enough that a
#: hang fails the test instead of the suite's timeout.
HANG_SECONDS = 30.0


def wait_until(condition: Callable[[], bool], timeout: float = HANG_SECONDS, interval: float = 0.01) -> bool:
    """Whether ``condition()`` holds, polled every ``interval`` seconds for up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(interval)
    return True


async def until(condition: Callable[[], bool], timeout: float = HANG_SECONDS, interval: float = 0.01) -> bool:
    """``wait_until`` without blocking the event loop: ``condition()`` is read on the loop's thread."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        await asyncio.sleep(interval)
    return True
