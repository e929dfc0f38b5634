"""Environment steps per second through rollforge's OpenEnv client, against a bare WebSocket loop.

A local OpenEnv server (``openenv``'s ``create_app`` around the ``endless`` demo environment, in a
subprocess bound to 127.0.0.1) serves ``S`` sessions at once, for S in ``--sessions`` (1, 16, 64).
Each session is reset, then stepped ``--steps / S`` times (at least 20) concurrently:

- **client**: ``OpenEnvSession.step`` with an assistant message holding one ``add`` tool call,
  exactly what the rollout engine calls: tool-call routing, the WebSocket exchange, the
  observation rendered into a tool ``Message`` and a ``Step``;
- **bare**: the same protocol exchange written directly on ``websockets``: send
  ``{"type": "step", "data": {"n": 1}}``, receive and ``json.loads`` the reply.

Both run in the same process against the same server, alternating (and alternating which goes
first), ``--repeats`` times; the median of each is reported. The machine's other load moves both
alike; on a busy 2-core machine single measurements vary by 10-20%. ``ratio_to_bare_ws`` is the client's steps/s at the largest session count
divided by the bare loop's (target >= 0.8): what the client costs on top of the protocol itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from ..testing import free_port
from ..types import Message, Sample, ToolCall


def add_arguments(parser: Any) -> None:
    parser.add_argument("--sessions", default="1,16,64", help="comma-separated concurrent session counts")
    parser.add_argument("--steps", type=int, default=4000, help="steps per measurement, split over the sessions")
    parser.add_argument("--repeats", type=int, default=5, help="alternating client/bare measurements per count")


def main(args: Any) -> dict[str, Any]:
    counts = [int(x) for x in str(args.sessions).split(",")]
    return run(counts, steps=args.steps, repeats=args.repeats)


def run(counts: list[int], *, steps: int = 4000, repeats: int = 5) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    # twice the sessions: the client's and the bare loop's are open at the same time
    server = subprocess.Popen(
        [sys.executable, "-m", "rollforge.envs.openenv.demo_servers", f"endless:{port}:{2 * max(counts)}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_healthy(url, server, log)
        client, bare = asyncio.run(_measure_all(url, counts, steps, repeats))
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    top = str(max(counts))
    return {
        "benchmark": "env-throughput",
        "server": "openenv create_app, demo env 'endless' (async step), 127.0.0.1, separate process",
        "steps_per_measurement": steps,
        "repeats": repeats,
        "steps_per_second": client,
        "bare_ws_steps_per_second": bare,
        "ratio_to_bare_ws": round(client[top] / bare[top], 3),
    }


async def _measure_all(url: str, counts: list[int], steps: int, repeats: int) -> tuple[dict, dict]:
    from ..envs.openenv import OpenEnvEnvironment

    env = OpenEnvEnvironment(url)
    client: dict[str, float] = {}
    bare: dict[str, float] = {}
    for count in counts:
        per_session = max(20, steps // count)
        runs: dict[str, list[float]] = {"client": [], "bare": []}
        await env.prepare(count)
        try:
            for repeat in range(repeats):  # alternate which goes first: neither gets a warmer server
                order = ("bare", "client") if repeat % 2 == 0 else ("client", "bare")
                for which in order:
                    if which == "bare":
                        runs["bare"].append(await _bare(env.ws_url, count, per_session))
                    else:
                        runs["client"].append(await _client(env, count, per_session))
        finally:
            await env.release()
        client[str(count)] = round(statistics.median(runs["client"]), 1)
        bare[str(count)] = round(statistics.median(runs["bare"]), 1)
    return client, bare


async def _client(env: Any, count: int, per_session: int) -> float:
    samples = [Sample(prompt=[{"role": "user", "content": "Count."}], row={"seed": i}) for i in range(count)]
    sessions = [env.open(s) for s in samples]
    resets = await asyncio.gather(*(session.reset(sample) for session, sample in zip(sessions, samples)))
    call = Message("assistant", "", tool_calls=(ToolCall("add", {"n": 1}),))
    conversations = [(*reset.prompt, call) for reset in resets]

    async def play(session: Any, conversation: tuple) -> None:
        for _ in range(per_session):
            step = await session.step(conversation)
            if step.failures or not step.messages:
                raise RuntimeError(f"unexpected step: {step}")

    started = time.perf_counter()
    await asyncio.gather(*(play(s, c) for s, c in zip(sessions, conversations)))
    elapsed = time.perf_counter() - started
    await asyncio.gather(*(session.close() for session in sessions))
    return count * per_session / elapsed


async def _bare(ws_url: str, count: int, per_session: int) -> float:
    from websockets.asyncio.client import connect

    sockets = await asyncio.gather(
        *(connect(ws_url, max_size=None, compression=None, ping_interval=None, proxy=None) for _ in range(count))
    )
    for i, ws in enumerate(sockets):
        await ws.send(json.dumps({"type": "reset", "data": {"seed": i}}))
        json.loads(await ws.recv())

    async def play(ws: Any) -> None:
        for _ in range(per_session):
            await ws.send(json.dumps({"type": "step", "data": {"n": 1}}))
            reply = json.loads(await ws.recv())
            if reply["type"] != "observation":
                raise RuntimeError(f"unexpected reply: {reply}")

    started = time.perf_counter()
    await asyncio.gather(*(play(ws) for ws in sockets))
    elapsed = time.perf_counter() - started
    for ws in sockets:
        await ws.send('{"type": "close"}')
        await ws.close()
    return count * per_session / elapsed


def _wait_healthy(url: str, server: subprocess.Popen, log: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the benchmark server exited: {log.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the benchmark server at {url} did not start within {timeout}s")
