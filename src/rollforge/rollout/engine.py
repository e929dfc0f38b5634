"""Scheduling many episodes: one async core, two modes with the same episode semantics.

- ``async`` (per-sample): up to ``concurrency`` episodes run at once, each on its own; while one
  waits for the environment, others generate, and the backend batches whatever requests are in
  flight.
- ``lockstep`` (batched): episodes run in waves of ``concurrency``; within a wave every active
  episode generates, then every active episode steps its environment, turn by turn (a barrier that
  finished episodes leave). Step-style environments then see one batched ``step`` per turn.

Both run the very same ``run_episode`` coroutine; only the ``Gate`` differs. Before anything is
generated the engine checks the inputs: every ``task_name`` has an environment (an
``Environment``), every ``environment`` column names one (``envs.factory.check_routes``, the check
training and the CLI run), the backend is a ``Backend``, environments that limit their sessions
(``max_sessions``) allow the concurrency needed, every prompt leaves room to generate under
``max_seq_len`` as rendered with its environment's tools (``check_prompt_lengths``, also run by the
CLI and training before the model loads), and the chat template renders the prompts in use
(``ChatRenderer.check_template``; tools are checked once per tool set, when an environment first
offers them). Samples drawn from prompts checked once (a ``CheckedBatch``, ``checks.py``: training
checks its prompts before the model loads) are not checked again for what that covers.
``Environment.prepare(sessions)`` and ``release()`` are called once around the rollout (remote
environments connect there and check the server's capacity for real); after ``prepare``, an
environment that declares ``produces_images`` needs a backend that declares ``accepts_images``.
Results come back in input order. The engine does not know what a tool is. With
``engine_workers > 1``, or a pool of worker processes (``workers=``, ``worker_pool.py``), the checked
rollout runs in worker processes instead (``engine_workers.py``), each running its share through
``run_checked`` (the checks, ``checks.py``, ran here once for the whole batch).

Failures inside an episode are recorded on its trajectory. An episode that ends in an
infrastructure failure (``Trajectory.outcome``: backend error, environment raised or hung) is run
again up to ``infra_retries`` times (``run_sample``: same index and seeds; reruns leave the lockstep
wave and run ungated); ``Trajectory.retries`` says how often. A bug in rollforge (see
``boundary.is_own_bug``) cancels the other episodes and propagates. ``on_episode`` runs as each episode
ends; what it raises is logged and counted (``on_episode_errors`` in the metrics), and the rollout
still completes and returns every trajectory. ``abandoned_worker_calls`` counts blocking calls (hung
sync tools) still running on rollforge's worker threads after their episodes gave up on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..envs.base import Environment, GeneratingEnvironment
from ..errors import ConfigError
from ..types import Sample, Trajectory
from ..workers import ENVIRONMENT_WORKERS, run_sync
from .checks import CheckedBatch, check_backend_takes_images, check_capacity, check_rollout, sessions_needed
from .config import RolloutConfig
from .context import EpisodeContext, Gate, OpenGate
from .episode import run_episode
from .metrics import rollout_metrics

if TYPE_CHECKING:
    from .worker_pool import EngineWorkers

logger = logging.getLogger(__name__)


@dataclass(frozen=True, repr=False)
class RolloutResult:
    trajectories: tuple[Trajectory, ...]
    metrics: dict[str, Any]

    def __repr__(self) -> str:  # short: asyncio and loggers repr results, and trajectories are big
        return (
            f"RolloutResult({len(self.trajectories)} trajectories, "
            f"mean_total_reward={self.metrics.get('mean_total_reward')})"
        )


class LockstepGate:
    """A barrier per phase that every active episode of a wave must reach; ``leave`` removes a
    finished episode so the others are not held for it."""

    def __init__(self, parties: int):
        self._parties = parties
        self._arrived: dict[str, int] = {}
        self._release: dict[str, asyncio.Future[None]] = {}

    async def wait(self, phase: str) -> None:
        future = self._release.get(phase)
        if future is None:
            future = self._release[phase] = asyncio.get_running_loop().create_future()
        self._arrived[phase] = self._arrived.get(phase, 0) + 1
        self._maybe_release(phase)
        try:
            # shielded: an episode cancelled here (its episode timeout) must not cancel the
            # future the other episodes of the wave wait on
            await asyncio.shield(future)
        except asyncio.CancelledError:
            if not future.done():
                self._arrived[phase] -= 1
            raise

    def leave(self) -> None:
        self._parties -= 1
        for phase in list(self._release):
            self._maybe_release(phase)

    def _maybe_release(self, phase: str) -> None:
        if self._arrived.get(phase, 0) >= self._parties and phase in self._release:
            self._arrived.pop(phase)
            self._release.pop(phase).set_result(None)


async def arollout(
    samples: Sequence[Sample],
    task_to_env: Mapping[str, Environment],
    backend: Backend,
    renderer: ChatRenderer,
    config: RolloutConfig | None = None,
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    session: RolloutSession | None = None,
    workers: EngineWorkers | None = None,
) -> RolloutResult:
    """Run every sample to the end of its episode and return trajectories in input order.
    ``session`` (``open_session``): the environments are already prepared and the episodes of
    every rollout sharing it count against one concurrency limit (overlapping rollouts). ``workers``
    (``EngineWorkers``): worker processes already started, for the episodes' engine work.
    ``samples`` may be a ``CheckedBatch`` (``CheckedPrompts.batch``): what it covers is not checked again."""
    config = config or RolloutConfig()
    checked = samples.prompts if isinstance(samples, CheckedBatch) else None
    samples = list(samples)
    check_rollout(samples, task_to_env, backend, renderer, config, capacity=session is None, checked=checked)
    if config.engine_workers > 1 or workers is not None:
        return await _in_workers(samples, task_to_env, backend, renderer, config, on_episode, session, workers)
    return await run_checked(samples, task_to_env, backend, renderer, config, on_episode=on_episode, session=session)


async def run_checked(
    samples: Sequence[Sample],
    task_to_env: Mapping[str, Environment],
    backend: Backend,
    renderer: ChatRenderer,
    config: RolloutConfig,
    *,
    on_episode: Callable[[Trajectory], None] | None = None,
    session: RolloutSession | None = None,
) -> RolloutResult:
    """``arollout``'s episodes in this process, for inputs ``check_rollout`` has passed (an engine
    worker's shard: its rollout's process checked the whole batch)."""
    ctx = EpisodeContext(backend, renderer, renderer.parser(config.tool_parser), config)
    results: list[Trajectory | None] = [None] * len(samples)
    needed = sessions_needed(samples, task_to_env, config)
    async with _prepared(task_to_env, needed) if session is None else contextlib.nullcontext():
        check_backend_takes_images(samples, task_to_env, backend)
        started = time.perf_counter()
        with _quiet_collector():
            callback_errors = await _schedule(
                samples, task_to_env, ctx, results, on_episode, session.limit if session else None
            )
    trajectories = tuple(t for t in results if t is not None)
    metrics = rollout_metrics(trajectories, time.perf_counter() - started)
    metrics["on_episode_errors"] = callback_errors
    # calls on rollforge's worker threads still running after their episode gave up (hung sync tools),
    # in this process now: each holds a thread until it returns
    metrics["abandoned_worker_calls"] = ENVIRONMENT_WORKERS.abandoned
    return RolloutResult(trajectories, metrics)


async def _in_workers(
    samples, task_to_env, backend, renderer, config: RolloutConfig, on_episode, session, workers
) -> RolloutResult:
    """The checked rollout spread over worker processes (``engine_workers.py``)."""
    if session is not None:
        raise ConfigError(
            f"engine workers (engine_workers={config.engine_workers}) cannot share a session's "
            "prepared environments with other rollouts (asynchronous training); set engine_workers=1 there"
        )
    from .engine_workers import run_in_workers

    with _quiet_collector():  # this process holds every trajectory coming back
        return RolloutResult(
            *await run_in_workers(samples, task_to_env, backend, renderer, config, on_episode, workers)
        )


_COLLECTOR = {"users": 0, "thresholds": (0, 0, 0)}


@contextlib.contextmanager
def _quiet_collector():
    """Objects alive when a rollout starts (the model, the libraries) are not garbage; without this,
    every full collection during the rollout walks all of them again (measured: +10% wall time at
    1k episodes). Episode state lives until its episode ends, so full collections find little: one
    per 100 middle-generation ones instead of 10 (measured at 10k episodes: 12.4 -> 9.5 s).
    Counted, so that overlapping rollouts (asynchronous training) restore the settings once, at
    the end of the last."""
    if _COLLECTOR["users"] == 0:
        gc.freeze()
        thresholds = _COLLECTOR["thresholds"] = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], 100))
    _COLLECTOR["users"] += 1
    try:
        yield
    finally:
        _COLLECTOR["users"] -= 1
        if _COLLECTOR["users"] == 0:
            gc.set_threshold(*_COLLECTOR["thresholds"])
            gc.unfreeze()


@dataclass(frozen=True)
class RolloutSession:
    """Environments prepared once for many rollouts that overlap (asynchronous training), whose
    episodes share one limit of ``concurrency`` running at once."""

    limit: asyncio.Semaphore


@contextlib.asynccontextmanager
async def open_session(task_to_env: Mapping[str, Environment], concurrency: int):
    """Prepare every environment of ``task_to_env`` for ``concurrency`` sessions (its capacity
    checked) and release them on exit; pass the session to each ``arollout``."""
    needed = {id(env): concurrency for env in task_to_env.values()}
    check_capacity(task_to_env, needed, f"concurrency={concurrency}, shared by overlapping rollouts")
    async with _prepared(task_to_env, needed):
        yield RolloutSession(asyncio.Semaphore(concurrency))


async def _schedule(
    samples, task_to_env, ctx: EpisodeContext, results: list, on_episode, limit: asyncio.Semaphore | None = None
) -> int:
    """Run every episode; returns how many ``on_episode`` calls raised. ``limit``: a concurrency
    limit shared with other rollouts (async mode)."""
    config = ctx.config
    callback_errors = 0

    async def run(index: int, gate) -> None:
        nonlocal callback_errors
        sample = samples[index]
        trajectory = await run_sample(
            config.first_index + index, sample, task_to_env[sample.task_name], ctx, gate, config.infra_retries
        )
        results[index] = trajectory
        if on_episode is not None:
            try:
                on_episode(trajectory)
            except Exception as exc:  # the caller's callback (a full disk): reported, never fatal
                callback_errors += 1
                logger.warning(
                    "on_episode raised for episode %d (the rollout goes on): %s: %s", index, type(exc).__name__, exc
                )

    if config.mode == "async":
        limit = limit or asyncio.Semaphore(config.concurrency)
        gate = OpenGate()

        async def limited(index: int) -> None:
            async with limit:
                await run(index, gate)

        await _all(limited(i) for i in range(len(samples)))
    else:
        for first in range(0, len(samples), config.concurrency):
            wave = range(first, min(first + config.concurrency, len(samples)))
            gate = LockstepGate(len(wave))
            await _all(run(i, gate) for i in wave)
    return callback_errors


async def run_sample(
    index: int, sample: Sample, env: Environment, ctx: EpisodeContext, gate: Gate, retries: int = 0
) -> Trajectory:
    """One sample's episode, run again (up to ``retries`` times) while it ends in an infrastructure
    failure (``Trajectory.outcome``); the trajectory returned is the last run's, with ``retries``
    set to the number of reruns. A rerun has the same index, hence the same sampling seeds and
    tool-call ids: a deterministic backend repeats itself. The first run holds its place in
    ``gate`` (a lockstep wave) and leaves it when it ends; reruns go through an ``OpenGate``, as
    the wave they would wait on has gone on without them (so a retry never holds the barrier)."""
    attempt = 0
    while True:
        if isinstance(env, GeneratingEnvironment):  # it runs its own turns: no barrier holds it
            gate.leave()
            trajectory = await env.run_episode(index, sample, ctx)
        else:
            trajectory = await run_episode(index, sample, env, ctx, gate)
        if trajectory.outcome != "infra_failure" or attempt >= retries:
            return replace(trajectory, retries=attempt) if attempt else trajectory
        attempt += 1
        logger.warning(
            "episode %d failed for infrastructure reasons (%s: %s); running it again (retry %d of %d)",
            index,
            trajectory.error.kind,
            trajectory.error.message,
            attempt,
            retries,
        )
        gate = OpenGate()


async def _all(coroutines) -> None:
    """Await every coroutine; the first exception (a rollforge bug: episodes record their own
    failures) cancels the others, waits for them to unwind, and propagates as it is."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def rollout(*args: Any, **kwargs: Any) -> RolloutResult:
    """Synchronous façade over ``arollout`` (runs its own event loop, also in a notebook)."""
    return run_sync(arollout(*args, **kwargs))


@contextlib.asynccontextmanager
async def _prepared(task_to_env: Mapping[str, Environment], needed: Mapping[int, int]):
    """``Environment.prepare(sessions)`` for each environment (by id) in ``needed`` (connect, read
    schemas, check a server's capacity for real; raise ``ConfigError`` when it does not fit) before
    anything is generated, and ``release()`` after the rollout for each whose ``prepare`` returned."""
    envs = {id(env): env for env in task_to_env.values()}
    async with contextlib.AsyncExitStack() as stack:
        for env_id, sessions in needed.items():
            env = envs[env_id]
            await env.prepare(sessions)
            stack.push_async_callback(env.release)
        yield
