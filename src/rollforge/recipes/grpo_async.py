"""Asynchronous training with bounded staleness (``algorithm.max_staleness`` = k >= 1).

The synchronous loop rolls out, updates, pushes the weights, and only then rolls out again:
generation idles while the model trains and the trainer idles while episodes run. Here a producer
keeps rolling out while the trainer updates: a ``Producer`` starts each step's ``Batch`` (its
samples, the prompt source's position, the task rolling it out), and ``train_async`` runs
``train_step_async`` on each, as ``train_sync`` runs ``train_step``.

- **Versions.** The backend is wrapped in a ``VersionedBackend``: version v is the weights after v
  updates. Each completion is stamped with the version that generated it, and the trainer's weight
  push happens *between requests*: a running episode continues under the new weights at its next
  turn (in-flight updates), and its ``Trajectory.versions`` show it.
- **Bound, by start.** Step s trains on version s - 1 and produces version s. The producer starts
  step s's batch (whole groups, drawn in the same order as the synchronous loop, with the same
  seeds) once the backend serves version s - 1 - k, so every token of it, generated at that
  version or later, is at most k versions old when trained. The trainer takes the batches in the
  order they started, waiting for a slow group rather than dropping it
  (``train/admission.py``): slow, hard problems are not starved. Tokens older than the bound
  (none, by construction) would be masked out and counted (``admission/dropped/stale``).
- **Exact versions** (``algorithm.exact_staleness``). Which version a batch sees then depends on
  timing: the trainer may push newer weights while it generates. With this option step s's whole
  batch generates at version max(start, s - 1 - k), because the push that would replace that
  version first waits for the batches up to step + k to finish generating (k-step off-policy, as
  veRL and ROLL do it). The samples are then a function of the seeds (up to the float noise of
  the HF backend's batching) and a run repeats itself whatever the machine's speed; generation of
  step s + k still overlaps step s's update.
- **Loss.** The importance ratios are corrected for the lag (``algorithm.off_policy_correction``).
- k = 0 makes the producer wait for each push: exactly the synchronous loop's requests and
  updates (tested step by step); ``atrain`` runs the synchronous loop (``grpo.py``) itself then.

Memory: a backend that generates with the trained model object (HF) gets its own copy of the
weights, refreshed at every push, so that generation goes on while the other copy trains. Not
supported yet: several ranks, a colocated vLLM (it sleeps while the trainer updates), and dynamic
sampling (``train/sampling.py``; refused by the config).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from ..rollout.engine import RolloutResult, arollout, open_session
from ..train.admission import AdmissionLedger
from ..train.learn import learn
from ..train.run import Run, after_step, draw, evaluate, evaluation_due, push_weights, rollout_config, score
from ..train.versions import VersionedBackend
from ..types import Sample


async def train_async(run: Run, on_step: Callable[..., Any] | None = None) -> int:
    """Steps ``run.start + 1 .. config.steps`` with generation ahead of training by up to
    ``max_staleness`` versions; returns the last step done. ``on_step(step, metrics, model, backend)``
    runs after each step with the versioned backend (``backend.pinned()`` holds the weights for an
    evaluation)."""
    versions = VersionedBackend(run.backend, version=run.start)
    step = run.start
    async with open_session(run.task_to_env, run.config.rollout.concurrency) as session:
        producer = Producer(run, versions, session)
        try:
            for step in producer.steps:
                await after_step(on_step, step, await train_step_async(run, step, producer), run, versions)
                if evaluation_due(run, step):
                    async with versions.pinned() as version:  # no update while the held-out episodes run
                        await evaluate(run, f"step-{step}", version)
        finally:
            await producer.stop()
    return step


async def train_step_async(run: Run, step: int, producer: Producer) -> dict[str, Any] | None:
    """One step: wait for the batch the producer started for it and for its rollout, then ``learn``
    from it (tokens older than version step - 1 - k are not trained), pushing version ``step``."""
    waiting = time.perf_counter()
    batch = await producer.batch(step)
    result, seconds = await batch.rollout
    waited = time.perf_counter() - waiting
    return await learn(
        run,
        step,
        await score(run, batch.samples, result),
        {"wait": waited},
        push=lambda: _push(run, producer, step),
        oldest=step - 1 - run.config.algorithm.max_staleness,
        extra=partial(_async_metrics, run, producer.ledger, step, seconds),
        data_state=batch.data_state,
    )


@dataclass(frozen=True)
class Batch:
    """One step's batch as the producer started it: its samples (whole groups), the prompt source's
    position after drawing them (what a checkpoint at this step resumes from) and the task rolling
    them out, which returns the ``RolloutResult`` and its seconds."""

    samples: tuple[Sample, ...]
    data_state: dict[str, int]
    rollout: asyncio.Task[tuple[RolloutResult, float]]


class Producer:
    """From its creation, starts each step's ``Batch``, in step order, once the backend serves the
    version the bound allows (step s: version s - 1 - k). ``batch(step)`` waits for it; a batch that
    could not start raises there, in the trainer. Its episodes report to the admission ``ledger`` as
    they finish; ``stop`` cancels what still runs."""

    def __init__(self, run: Run, versions: VersionedBackend, session: Any):
        self.run, self.versions, self.session = run, versions, session
        self.ledger = AdmissionLedger(run.config.algorithm.group_size)
        self.steps = range(run.start + 1, run.config.steps + 1)
        loop = asyncio.get_running_loop()
        self._batches: dict[int, asyncio.Future[Batch]] = {s: loop.create_future() for s in self.steps}
        self._tasks = [asyncio.create_task(self._produce())]  # then each batch's rollout

    async def batch(self, step: int) -> Batch:
        return await self._batches[step]

    async def stop(self) -> None:
        """Cancel the producer and the rollouts still running, and wait until they are gone."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _produce(self) -> None:
        run, k = self.run, self.run.config.algorithm.max_staleness
        for step in self.steps:
            try:
                await self.versions.reached(step - 1 - k)
                samples = draw(run)
                state = run.source.state()
                self.ledger.start(len(samples))
                self._tasks.append(rollout := asyncio.create_task(self._rollout(step, samples)))
                self._batches[step].set_result(Batch(tuple(samples), state, rollout))
            except Exception as exc:  # the trainer waiting on this step hears of it
                self._batches[step].set_exception(exc)
                raise

    async def _rollout(self, step: int, samples: list[Sample]) -> tuple[RolloutResult, float]:
        run, began = self.run, time.perf_counter()
        result = await arollout(
            run.checked.batch(samples),  # checked before the model loaded: not again
            run.task_to_env,
            self.versions,
            run.renderer,
            rollout_config(run, step, len(samples)),
            session=self.session,
            on_episode=lambda t: self.ledger.finish(step, t),
        )
        return result, time.perf_counter() - began


async def _push(run: Run, producer: Producer, step: int) -> None:
    """Version ``step``: the weights after step ``step``'s update. Exactly (``exact_staleness``):
    once the batches that generate at the version it replaces, those up to step + k, have finished."""
    algo = run.config.algorithm
    if algo.exact_staleness:
        for later in range(step + 1, min(step + algo.max_staleness, run.config.steps) + 1):
            await (await producer.batch(later)).rollout
    await producer.versions.advance(lambda: push_weights(run))


def _async_metrics(
    run: Run, ledger: AdmissionLedger, step: int, seconds: float, done: Any, dropped: dict[str, int]
) -> dict[str, Any]:
    """``learn``'s ``extra`` for a step whose rollout took ``seconds``: the tokens' lag, and the
    admission ledger's record of the batch and of what of it contributes nothing."""
    algo = run.config.algorithm
    return {
        **_lag(done.trajectories, step - 1),
        "async/max_staleness": algo.max_staleness,
        "async/rollout_seconds": seconds,
        **ledger.admit(step, done.trajectories, {**dropped, **_dropped(done.trajectories, algo.group_size)}),
    }


def _lag(trajectories: Any, trained: int) -> dict[str, Any]:
    """How old the batch's tokens are against ``trained``, the version being updated."""
    ages = [trained - v for t in trajectories for v in t.versions]
    return {
        "async/token_lag_mean": sum(ages) / len(ages) if ages else None,
        "async/token_lag_max": max(ages) if ages else None,
        "async/episodes_spanning_versions": sum(len(set(t.versions)) > 1 for t in trajectories),
    }


def _dropped(trajectories: Any, group_size: int) -> dict[str, int]:
    """Episodes of the batch that contribute nothing, by reason (see ``train/admission.py``):
    infrastructure failures (out of their group's baseline) and the members left in a group of fewer
    than two."""
    infra = [t.outcome == "infra_failure" for t in trajectories]
    lost = 0
    for first in range(0, len(infra), group_size):
        kept = group_size - sum(infra[first : first + group_size])
        lost += kept if kept < 2 else 0
    return {"infra_failure": sum(infra), "group_lost": lost}
