"""The weight gate: an update holds new requests, drains those in flight, applies, resumes; updates
run one at a time and wait for pins; an update that fails or is cancelled lets requests resume.

Requests and updates hold until the test releases them (``asyncio.Event``), and ``settle()`` lets
every task that can run reach its next wait; the tests assert the exact event log. No test
sleeps for a time or measures one."""

from __future__ import annotations

import asyncio

import pytest

from rollforge.backends.gate import WeightGate
from rollforge.testing import HANG_SECONDS


async def settle() -> None:
    """Let every ready task run until it waits (each pass of the loop runs what is ready; the gate's
    waits take a few passes: condition lock, wait, re-acquire)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def request(gate: WeightGate, log: list, name: str, release: asyncio.Event | None = None) -> None:
    async with gate.request():
        log.append(f"{name} starts")
        if release is not None:
            await release.wait()
        log.append(f"{name} ends")


async def update(
    gate: WeightGate, log: list, name: str = "update", release: asyncio.Event | None = None, **kwargs
) -> None:
    async with gate.update(**kwargs):
        log.append(f"{name} applies")
        if release is not None:
            await release.wait()
        log.append(f"{name} applied")


async def finish(*tasks: asyncio.Task) -> None:
    await asyncio.wait_for(asyncio.gather(*tasks), HANG_SECONDS)


async def test_an_update_holds_new_requests_drains_running_ones_applies_and_resumes():
    gate, log, release = WeightGate(), [], asyncio.Event()
    running = asyncio.create_task(request(gate, log, "running", release))
    await settle()
    updating = asyncio.create_task(update(gate, log))
    await settle()
    held = asyncio.create_task(request(gate, log, "held"))
    await settle()
    assert gate.updating and gate.in_flight == 1 and log == ["running starts"]  # holding and draining
    release.set()
    await finish(running, updating, held)
    assert log == ["running starts", "running ends", "update applies", "update applied", "held starts", "held ends"]
    assert not gate.updating and gate.in_flight == 0


async def test_without_drain_an_update_only_holds_new_requests():
    gate, log = WeightGate(), []
    release_running, release_update = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(request(gate, log, "running", release_running))
    await settle()
    updating = asyncio.create_task(update(gate, log, release=release_update, drain=False))
    await settle()
    held = asyncio.create_task(request(gate, log, "held"))
    await settle()
    assert log == ["running starts", "update applies"] and gate.in_flight == 1  # applied under a running request
    release_update.set()
    await finish(updating, held)
    release_running.set()
    await finish(running)
    assert log == ["running starts", "update applies", "update applied", "held starts", "held ends", "running ends"]


async def test_updates_run_one_at_a_time_and_wait_for_pins():
    gate, log, release_first = WeightGate(), [], asyncio.Event()
    async with gate.pinned():
        first = asyncio.create_task(update(gate, log, "first", release_first))
        second = asyncio.create_task(update(gate, log, "second"))
        await settle()
        assert log == [] and not gate.updating  # pinned: no update starts
        await request(gate, log, "pinned request")  # requests still run
    await settle()
    assert log == ["pinned request starts", "pinned request ends", "first applies"]  # the second waits for it
    release_first.set()
    await finish(first, second)
    assert log == [
        "pinned request starts",
        "pinned request ends",
        "first applies",
        "first applied",
        "second applies",
        "second applied",
    ]


@pytest.mark.parametrize("ending", ["error", "cancelled while draining"])
async def test_requests_resume_after_an_update_that_does_not_finish(ending):
    gate, log, release = WeightGate(), [], asyncio.Event()
    running = asyncio.create_task(request(gate, log, "running", release))
    await settle()
    if ending == "error":
        release.set()
        await finish(running)

        async def failing():
            async with gate.update():
                raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):
            await failing()
    else:
        updating = asyncio.create_task(update(gate, log))
        await settle()
        assert gate.updating and log == ["running starts"]  # draining
        updating.cancel()
        await asyncio.gather(updating, return_exceptions=True)
    await asyncio.wait_for(request(gate, log, "after"), HANG_SECONDS)  # not held, not draining
    release.set()
    await finish(running)
    assert not gate.updating and "update applies" not in log
    expected = ["after starts", "after ends"] + (["running ends"] if ending != "error" else [])
    assert log[-len(expected) :] == expected


async def test_wait_until_wakes_on_a_change_made_inside_an_update():
    gate, state = WeightGate(), {"version": 0}
    reached = asyncio.create_task(gate.wait_until(lambda: state["version"] >= 1))
    await settle()
    assert not reached.done()
    async with gate.update():
        state["version"] = 1
    await asyncio.wait_for(reached, HANG_SECONDS)
