"""Engine worker processes: one rollout's episodes spread over several event loops.

One Python event loop does every episode's engine work (render, parse, tools, bookkeeping) on one
core: about 8,000 turns per second. ``RolloutConfig.engine_workers = N`` (``--engine-workers N``)
splits the samples into ``N`` contiguous shards, each run in its own process (``worker_process.py``,
through ``engine.run_checked``: the checks ran here, once for the batch), behind the same
``rollout()`` / ``arollout()``. A worker is a fresh interpreter given this one's import path
(not a fork: the caller's threads and event loop stay here; not multiprocessing's spawn, which
re-runs the caller's script). Its start costs about 1.5 s of CPU (measured on the shared 2-core
machine): 0.3 s for the interpreter and rollforge (the worker's own modules import no
transformers, torch or numpy), then 1.0-1.3 s for transformers, which unpickling the renderer's
tokenizer imports (transformers 5 scans its model files and the installed packages' metadata on
import). So workers live in a pool (``worker_pool.py``,
``EngineWorkers``) that starts them once and serves many rollouts: ``arollout(..., workers=pool)``
(a training run opens one for all its steps); without one, the rollout opens a pool for itself
and closes it at its end.

Design:

- What crosses is pickled: each worker gets, once per pool, ``task_to_env`` (environment classes
  and factories by reference: they must be importable from a module, not defined in the script
  that runs or inside a function), the renderer's tokenizer and family (a ``VisionRenderer``'s
  processor too, so that a worker expands images into the same ids) and how it generates; then,
  per rollout, its shard of samples and the config with ``first_index`` moved to the shard's start.
  Episode indices, hence sampling
  seeds and tool-call ids, are the global ones: a deterministic backend produces the same
  trajectories with any number of workers. ``concurrency`` is divided among the workers (the
  shares sum to it), so environments that cap their sessions see the same total.
- Generation: a backend with a ``reopener`` (``Backend.reopener``: the scripted backend) is opened
  again in each worker. Any other stays in this process, the one backend the caller opened (an HF
  model, a vLLM engine, a router of servers: there is one of it). Each worker's episodes talk to
  a ``_ProxyBackend`` that sends ``(prompt ids, SamplingParams)`` here; this process calls
  ``backend.generate`` inside the same ``boundary`` the episode would, and sends the ``Completion``
  (or the ``EpisodeFailed``) back. A request the worker gives up on (its timeout) is cancelled here;
  each request names its episode, so a router here keeps an episode's turns on one replica.
- Transport (``worker_channel.py``): one socket pair per worker, length-prefixed pickled frames,
  the messages of one loop iteration in one frame; writes never block, so no deadlock.
- Results: trajectories come back as their episodes end, those that ended in one worker loop
  iteration in one pickle (one call and a shared memo: cheaper to write and read than one pickle
  each); ``on_episode`` runs here, in order of arrival, and the result holds them in input
  order; metrics are computed once over all of them (``abandoned_worker_calls`` summed over the
  workers). ``engine_worker_start_cpu_seconds`` lists each worker's CPU seconds before it was ready
  (interpreter, imports, unpickling the pool's setup) for the first rollout it serves, None for a
  later one: the fixed price of a worker, which a pool pays once.
- Failures: a worker that dies (its socket closes) fails only its unfinished episodes, each
  recorded as an ``env_error`` (an infrastructure failure) naming the worker and its exit code; the
  others run on, and the pool starts it again for the next rollout. Not bounded: a worker whose
  event loop itself blocks forever (a sync tool run on the loop) holds the rollout, as it would in
  one process. An error that a one-process rollout would raise (a rollforge bug, a refused
  configuration) is raised here and stops every worker (the pool is closed). Workers ignore
  SIGINT: Ctrl-C cancels the rollout here, which terminates every worker of the pool (bounded
  waits, then SIGKILL); a worker whose parent vanished stops on its own when the socket closes.

On a cluster (N nodes x M workers) the same shape holds one level up: a driver splits the batch
into N contiguous node shards with ``first_index`` at each shard's start (the same seeds); each
node runs ``rollout(..., engine_workers=M)`` with a backend that reaches the shared generation
service (a router over OpenAI-compatible servers), so generation is still one service while the
engine CPU grows with N x M. Only trajectories travel back to the driver.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping, Sequence

from ..backends.base import CURRENT_EPISODE, Backend
from ..boundary import boundary
from ..types import Failure, Sample, Trajectory
from .config import RolloutConfig
from .metrics import rollout_metrics
from .worker_channel import Channel, Shard, loads, portable_error
from .worker_pool import EngineWorkers, PoolWorker, pickled, stop

logger = logging.getLogger(__name__)


async def run_in_workers(
    samples: Sequence[Sample],
    task_to_env: Mapping[str, Any],
    backend: Backend,
    renderer: Any,
    config: RolloutConfig,
    on_episode: Callable[[Trajectory], None] | None,
    workers: EngineWorkers | None = None,
) -> tuple[tuple[Trajectory, ...], dict[str, Any]]:
    """Run ``samples`` on the pool ``workers``, or on ``config.engine_workers`` processes started
    for this rollout alone (see the module docstring); the caller has checked the inputs. Returns
    the trajectories in input order and the metrics."""
    if workers is not None:
        workers.check(task_to_env, backend, renderer, config.engine_workers)
        return await _run(workers, samples, backend, config, on_episode, time.perf_counter())
    started = time.perf_counter()
    count = len(_shards(len(samples), config.engine_workers, config.concurrency))
    async with EngineWorkers(count, task_to_env, backend, renderer) as workers:
        return await _run(workers, samples, backend, config, on_episode, started)


async def _run(
    pool: EngineWorkers,
    samples: Sequence[Sample],
    backend: Backend,
    config: RolloutConfig,
    on_episode: Callable[[Trajectory], None] | None,
    started: float,
):
    shards = _shards(len(samples), pool.count, config.concurrency)
    payloads = [_payload(samples, config, *shard) for shard in shards]  # refusals first
    results: list[Trajectory | None] = [None] * len(samples)
    callback_errors = 0

    def deliver(position: int, trajectory: Trajectory) -> None:
        nonlocal callback_errors
        results[position] = trajectory
        if on_episode is not None:
            try:
                on_episode(trajectory)
            except Exception as exc:  # the caller's callback: reported, never fatal (as in engine.py)
                callback_errors += 1
                logger.warning(
                    "on_episode raised for episode %d (the rollout goes on): %s: %s",
                    trajectory.index,
                    type(exc).__name__,
                    exc,
                )

    async with pool.lease(len(shards)) as leased:
        drives = [_Drive(worker, channel, start, stop) for (worker, channel), (start, stop, _) in zip(leased, shards)]
        for drive, payload in zip(drives, payloads):
            drive.channel.send(("shard", payload))
        await _gather(*(_drive(drive, backend, config, deliver) for drive in drives))
    for drive in drives:
        for position in range(drive.start, drive.stop):
            if results[position] is None:
                deliver(position, _lost(samples[position], config.first_index + position, drive.worker))
    trajectories = tuple(results)  # type: ignore[arg-type]
    metrics = rollout_metrics(trajectories, time.perf_counter() - started)
    metrics["on_episode_errors"] = callback_errors
    metrics["abandoned_worker_calls"] = sum(drive.abandoned_calls for drive in drives)
    metrics["engine_worker_start_cpu_seconds"] = [drive.start_cpu for drive in drives]
    return trajectories, metrics


class _Drive:
    """One worker's part of one rollout: its shard ``samples[start:stop]``, and what it reported."""

    def __init__(self, worker: PoolWorker, channel: Channel, start: int, stop: int):
        self.worker, self.channel, self.start, self.stop = worker, channel, start, stop
        self.abandoned_calls = 0
        # the worker's start, for the first rollout it serves (a pool's later rollouts: None)
        self.start_cpu = worker.start_cpu if worker.rollouts == 0 else None


def _shards(count: int, workers: int, concurrency: int) -> list[tuple[int, int, int]]:
    """``(start, stop, concurrency)`` per worker: contiguous, as even as possible, never empty;
    the concurrency shares sum to ``concurrency`` (so at most that many workers)."""
    n = min(workers, count, concurrency)
    bounds = [count * k // n for k in range(n + 1)]
    return [(bounds[k], bounds[k + 1], concurrency // n + (k < concurrency % n)) for k in range(n)]


def _payload(samples, config: RolloutConfig, start: int, stop: int, concurrency: int) -> bytes:
    shard_config = config.model_copy(
        update={"first_index": config.first_index + start, "concurrency": concurrency, "engine_workers": 1}
    )
    return pickled(Shard(samples[start:stop], shard_config), f"engine_workers={config.engine_workers}")


async def _drive(drive: _Drive, backend: Backend, config: RolloutConfig, deliver) -> None:
    """Serve one worker's generation requests and collect its trajectories until it is done or gone."""
    requests: dict[int, asyncio.Task] = {}
    episodes: dict[int, _Episode] = {}  # the worker's live episodes, as CURRENT_EPISODE objects here
    try:
        while True:
            try:
                messages = await drive.channel.receive()
            except EOFError:  # died: its unfinished episodes are recorded as lost (with its exit code)
                await stop([drive.worker])
                return
            for kind, *rest in messages:
                if kind == "generate":
                    request, episode, *call = rest
                    episode = None if episode is None else episodes.setdefault(episode, _Episode())
                    task = requests[request] = asyncio.ensure_future(
                        _answer(drive.channel, backend, request, episode, *call)
                    )
                    task.add_done_callback(lambda _, request=request: requests.pop(request, None))
                elif kind == "cancel" and rest[0] in requests:
                    requests[rest[0]].cancel()
                elif kind == "ended":
                    episodes.pop(rest[0], None)
                elif kind == "episodes":
                    for trajectory in loads(rest[0]):
                        deliver(trajectory.index - config.first_index, trajectory)
                elif kind == "done":
                    drive.abandoned_calls = rest[0]
                    return
                elif kind == "raised":
                    raise rest[0]
    finally:
        for task in list(requests.values()):
            task.cancel()


class _Episode:
    """A worker's episode as this process's ``CURRENT_EPISODE`` (a router's sticky placement)."""


async def _answer(
    channel: Channel, backend: Backend, request: int, episode: _Episode | None, prompt_ids, params, images
) -> None:
    """One request of a worker's episode, generated here inside the episode's own boundary."""
    CURRENT_EPISODE.set(episode)  # this task's own context
    try:
        with boundary("backend", None):
            if images is None:
                completion = await backend.generate(prompt_ids, params)
            else:
                completion = await backend.generate(prompt_ids, params, images=images)
        channel.send(("completion", request, completion, None))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # EpisodeFailed, or a rollforge bug: the episode raises it there
        channel.send(("completion", request, None, portable_error(exc)))


async def _gather(*coroutines) -> None:
    """All of them; the first exception cancels the others and propagates."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _lost(sample: Sample, index: int, worker: PoolWorker) -> Trajectory:
    """The episode of a worker that died before it ended: an infrastructure failure."""
    code = worker.process.returncode
    return Trajectory(
        index=index,
        task_name=sample.task_name,
        messages=(),
        token_ids=(),
        loss_mask=(),
        logprobs=(),
        prompt_length=0,
        rewards=(),
        total_reward=0.0,
        turns=0,
        ending="error",
        error=Failure(
            "env_error",
            f"engine worker {worker.number} (pid {worker.process.pid}) died with exit "
            f"code {code} before this episode ended",
        ),
    )
