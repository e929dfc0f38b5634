"""10,000 concurrent episodes in one process (``rollforge bench scale``).

Every episode is in flight at once (concurrency = episodes): the overhead benchmark's tool-calling
conversation (a Hermes ``note`` call per turn, the real chat template of the tiny test tokenizer),
a scripted backend with a fixed latency per request (1 s) and a light environment (``async def``
tool and construction on the event loop: ``run_in_thread=False``, nothing blocks).

Memory: the resident set is read from ``/proc/self/status`` right before the rollout
(``rss_before_mb``, after a full collection) and its high-water mark after it. Earlier peaks (the
tokenizer's training) would hide the rollout's own, so the mark is reset first by writing ``5`` to
``/proc/self/clear_refs`` (Linux >= 4.0; ``peak_reset`` says whether it worked, else the peak is an
upper bound). ``memory_per_episode_kb`` = (peak - before) / episodes, and includes the finished
trajectories the result holds. ``--tracemalloc`` adds a second, traced run (slower) and reports
Python's own allocation peak per episode.

Time: no scheduler finishes before ``turns x latency`` (each turn waits for its own generation);
``ratio_to_lower_bound`` is the wall time over that and ``engine_ms_per_turn`` the excess per turn,
as in ``overhead``. At this size the process's CPU time (``cpu_seconds``: the event loop's render,
parse, tool and bookkeeping for 40,000 turns, on one core) exceeds that bound, so the loop, not the
backend, sets the pace: every turn the 10,000 episodes wake together and queue for it.

``run(..., wrap_environment=f)`` replaces the environment by ``f(environment)`` before the rollout;
``--executor ray`` uses that to put the environment in a pool of Ray actors (``--env-actors``, on a
private local Ray instance): the same episodes, with every reset, step and finish crossing to
another process. ``peak_rss_mb`` is then the driver's; ``actor_peak_rss_mb`` lists the actors'.

``--engine-workers N`` spreads the episodes over N engine processes (``rollout/engine_workers.py``;
generation, the scripted backend, is reopened in each), on a pool started before the clock starts
(``EngineWorkers``, as a training run keeps one for all its steps): ``wall_seconds`` is the warm
pool's rollout, and ``worker_start_seconds`` the wall time the pool took to start (a fresh
interpreter per worker, importing rollforge and transformers, unpickling the environments and
tokenizer), ``worker_start_cpu_seconds`` each worker's CPU seconds for it. ``cpu_seconds`` is
this process's; ``worker_cpu_seconds`` the workers' own, their start included; ``peak_rss_mb`` is
this process's only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import time
import tracemalloc
from typing import Any, Callable

from ..backends.scripted import ScriptedBackend
from ..chat.render import ChatRenderer
from ..envs.base import Environment
from ..errors import ConfigError
from ..envs.factory import FactoryEnvironment
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..rollout.worker_pool import EngineWorkers
from ..testing import tokenizer_or_tiny
from .soak.probes import reset_peak, status_kb
from ..types import Sample
from .overhead import AsyncNotebook, scripted_reply


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system) a live process has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(
    episodes: int = 10_000,
    turns: int = 4,
    latency: float = 1.0,
    trace: bool = False,
    tokenizer_dir: str | None = None,
    wrap_environment: Callable[[Environment], Environment] | None = None,
    engine_workers: int = 1,
) -> dict[str, Any]:
    renderer = ChatRenderer(tokenizer_or_tiny(tokenizer_dir))
    env: Environment = FactoryEnvironment(AsyncNotebook, run_in_thread=False)
    task_to_env = {"notes": env if wrap_environment is None else wrap_environment(env)}
    config = RolloutConfig(
        max_turns=turns, concurrency=episodes, max_seq_len=8192, max_new_tokens=64, engine_workers=engine_workers
    )
    # the tokenizer, not the renderer: it pickles, so engine workers reopen the backend themselves
    backend = ScriptedBackend(
        scripted_reply, renderer.tokenizer, end_token_id=renderer.stop_token_ids[0], latency=latency
    )

    def rollout(pool: EngineWorkers | None):
        samples = [
            Sample(prompt=[{"role": "user", "content": f"Episode {i}."}], task_name="notes") for i in range(episodes)
        ]
        return asyncio.run(arollout(samples, task_to_env, backend, renderer, config, workers=pool))

    with contextlib.ExitStack() as stack:
        started = time.perf_counter()
        pool = (
            stack.enter_context(EngineWorkers(engine_workers, task_to_env, backend, renderer))
            if engine_workers > 1
            else None
        )
        start_seconds = time.perf_counter() - started
        out = _timed(functools.partial(rollout, pool), episodes, turns, latency, pool)
        out["worker_start_seconds"] = round(start_seconds, 3) if pool is not None else 0.0
        out["worker_start_cpu_seconds"] = [round(cpu, 3) for cpu in pool.start_cpu_seconds] if pool is not None else []
        if trace:
            gc.collect()
            tracemalloc.start()
            try:
                rollout(pool)
                out["tracemalloc_peak_kb_per_episode"] = round(tracemalloc.get_traced_memory()[1] / 1024 / episodes, 2)
            finally:
                tracemalloc.stop()
    return out


def _timed(
    rollout: Callable[[], Any], episodes: int, turns: int, latency: float, pool: EngineWorkers | None
) -> dict[str, Any]:
    """One rollout, measured: memory, wall and CPU time (this process's, and the workers' since their start)."""
    gc.collect()
    rss_before = status_kb("VmRSS")
    peak_reset = reset_peak()
    started, cpu_started = time.perf_counter(), time.process_time()
    result = rollout()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    workers_cpu = sum(_cpu_seconds(pid) for pid in pool.pids) if pool is not None else 0.0
    peak = status_kb("VmHWM")
    bound = turns * latency
    done_turns = result.metrics["total_turns"]
    return {
        "benchmark": "scale",
        "episodes": episodes,
        "concurrency": episodes,
        "engine_workers": 1 if pool is None else pool.count,
        "turns_per_episode": turns,
        "backend_latency_s": latency,
        "rss_before_mb": round(rss_before / 1024, 1),
        "peak_rss_mb": round(peak / 1024, 1),
        "peak_reset": peak_reset,
        "memory_per_episode_kb": round((peak - rss_before) / episodes, 2),
        "wall_seconds": round(wall, 3),
        "lower_bound_seconds": bound,
        "ratio_to_lower_bound": round(wall / bound, 4),
        "engine_ms_per_turn": round(1000 * (wall - bound) / max(done_turns, 1), 4),
        "cpu_seconds": round(cpu, 3),
        "worker_cpu_seconds": round(workers_cpu, 3),
        "turns_completed": done_turns,
        "errors": result.metrics["errors"],
        "tool_failures": result.metrics["failures"],
    }


def run_on_ray(
    episodes: int, turns: int, latency: float, actors: int, tokenizer_dir: str | None = None
) -> dict[str, Any]:
    from ..cluster.connect import ensure_ray
    from ..cluster.env_pool import RayEnvironmentPool

    ray = ensure_ray()
    pools: list[RayEnvironmentPool] = []

    def on_actors(env: Environment) -> Environment:
        pools.append(RayEnvironmentPool(env, actors=actors, num_cpus=0, name="notes"))
        return pools[0]

    try:
        out = run(episodes, turns, latency, tokenizer_dir=tokenizer_dir, wrap_environment=on_actors)
        pids = ray.get([pools[0].actor(slot).pid.remote() for slot in range(actors)])
        out["actor_peak_rss_mb"] = [round(status_kb("VmHWM", pid) / 1024, 1) for pid in pids]
    finally:
        for pool in pools:
            pool.shutdown()
    return {**out, "executor": "ray", "env_actors": actors}


def add_arguments(parser: Any) -> None:
    parser.add_argument("--episodes", type=int, default=10_000, help="episodes, all in flight at once")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per backend request")
    parser.add_argument(
        "--tracemalloc", action="store_true", help="add a traced run: Python allocation peak per episode"
    )
    parser.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="ray: the environment in a pool of Ray actors on a private local instance",
    )
    parser.add_argument("--env-actors", type=int, default=2, help="with --executor ray: actors in the pool")
    parser.add_argument(
        "--engine-workers",
        type=int,
        default=1,
        help="engine processes the episodes are spread over (generation stays in this one)",
    )


def main(args: Any) -> dict[str, Any]:
    if args.executor == "ray" and args.engine_workers != 1:
        raise ConfigError(
            f"--engine-workers {args.engine_workers} runs with --executor local only (the Ray "
            "pool is already out of process)"
        )
    if args.executor == "ray":
        return run_on_ray(args.episodes, args.turns, args.latency, args.env_actors)
    workers = RolloutConfig.build(engine_workers=args.engine_workers).engine_workers
    return {
        **run(args.episodes, args.turns, args.latency, args.tracemalloc, engine_workers=workers),
        "executor": "local",
    }
