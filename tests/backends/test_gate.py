"""The weight gate: an update holds new requests, drains those in flight, applies, resumes; updates
run one at a time and wait for pins; an update that fails or is cancelled lets requests resume."""

from __future__ import annotations

import asyncio

import pytest

from rollforge.backends.gate import WeightGate


async def request(gate: WeightGate, log: list, name: str, seconds: float = 0.0) -> None:
    async with gate.request():
        log.append(f"{name} starts")
        await asyncio.sleep(seconds)
        log.append(f"{name} ends")


async def update(gate: WeightGate, log: list, name: str = "update", seconds: float = 0.0, **kwargs) -> None:
    async with gate.update(**kwargs):
        log.append(f"{name} applies")
        await asyncio.sleep(seconds)
        log.append(f"{name} applied")


async def test_an_update_holds_new_requests_drains_running_ones_applies_and_resumes():
    gate, log = WeightGate(), []
    running = asyncio.create_task(request(gate, log, "running", 0.05))
    await asyncio.sleep(0.01)
    updating = asyncio.create_task(update(gate, log, seconds=0.02))
    await asyncio.sleep(0.01)
    assert gate.updating and gate.in_flight == 1 and log == ["running starts"]  # draining
    held = asyncio.create_task(request(gate, log, "held"))
    await asyncio.gather(running, updating, held)
    assert log == ["running starts", "running ends", "update applies", "update applied", "held starts", "held ends"]
    assert not gate.updating and gate.in_flight == 0


async def test_without_drain_an_update_only_holds_new_requests():
    gate, log = WeightGate(), []
    running = asyncio.create_task(request(gate, log, "running", 0.05))
    await asyncio.sleep(0.01)
    updating = asyncio.create_task(update(gate, log, seconds=0.01, drain=False))
    held = asyncio.create_task(request(gate, log, "held"))
    await asyncio.gather(running, updating, held)
    assert log == ["running starts", "update applies", "update applied", "held starts", "held ends", "running ends"]


async def test_updates_run_one_at_a_time_and_wait_for_pins():
    gate, log = WeightGate(), []
    async with gate.pinned():
        first = asyncio.create_task(update(gate, log, "first", 0.02))
        second = asyncio.create_task(update(gate, log, "second"))
        await asyncio.sleep(0.02)
        assert log == [] and not gate.updating  # pinned: no update starts
        await request(gate, log, "pinned request")  # requests still run
    await asyncio.gather(first, second)
    assert log == ["pinned request starts", "pinned request ends", "first applies", "first applied",
                   "second applies", "second applied"]


@pytest.mark.parametrize("ending", ["error", "cancelled while draining"])
async def test_requests_resume_after_an_update_that_does_not_finish(ending):
    gate, log = WeightGate(), []
    running = asyncio.create_task(request(gate, log, "running", 0.05))
    await asyncio.sleep(0.01)
    if ending == "error":
        await running

        async def failing():
            async with gate.update():
                raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):
            await failing()
    else:
        updating = asyncio.create_task(update(gate, log))
        await asyncio.sleep(0.01)
        assert gate.updating
        updating.cancel()
        await asyncio.gather(updating, return_exceptions=True)
    await asyncio.wait_for(request(gate, log, "after"), timeout=5)
    await running
    assert not gate.updating and "update applies" not in log and "after ends" in log


async def test_wait_until_wakes_on_a_change_made_inside_an_update():
    gate, state = WeightGate(), {"version": 0}
    reached = asyncio.create_task(gate.wait_until(lambda: state["version"] >= 1))
    await asyncio.sleep(0.01)
    assert not reached.done()
    async with gate.update():
        state["version"] = 1
    await asyncio.wait_for(reached, timeout=5)
