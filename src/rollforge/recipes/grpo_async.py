"""Asynchronous training with bounded staleness (``algorithm.max_staleness`` = k >= 1).

The synchronous loop rolls out, updates, pushes the weights, and only then rolls out again:
generation idles while the model trains and the trainer idles while episodes run. Here a producer
keeps rolling out while the trainer updates:

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
from typing import Any, Callable

from ..rollout.engine import arollout, open_session
from ..train.admission import AdmissionLedger
from ..train.run import Run, after_step, draw, evaluate, evaluation_due, learn, push_weights, rollout_config, score
from ..train.versions import VersionedBackend


async def train_async(run: Run, on_step: Callable[..., Any] | None = None) -> int:
    """Steps ``run.start + 1 .. config.steps`` with generation ahead of training by up to
    ``max_staleness`` versions; returns the last step done. ``on_step(step, metrics, model, backend)``
    runs after each step with the versioned backend (``backend.pinned()`` holds the weights for an
    evaluation)."""
    config, algo = run.config, run.config.algorithm
    k = algo.max_staleness
    versions = VersionedBackend(run.backend, version=run.start)
    ledger = AdmissionLedger(algo.group_size)
    steps = range(run.start + 1, config.steps + 1)
    batches: dict[int, asyncio.Future] = {s: asyncio.get_running_loop().create_future() for s in steps}
    rollouts: list[asyncio.Task] = []

    async def rollout(step: int, samples: list) -> tuple[Any, float]:
        began = time.perf_counter()
        result = await arollout(
            samples,
            run.task_to_env,
            versions,
            run.renderer,
            rollout_config(run, step, len(samples)),
            session=session,
            on_episode=lambda t: ledger.finish(step, t),
        )
        return result, time.perf_counter() - began

    async def produce() -> None:
        for step in steps:
            try:
                await versions.reached(step - 1 - k)
                samples = draw(run)
                state = run.source.state()  # what a checkpoint at this step resumes from
                ledger.start(len(samples))
                rollouts.append(task := asyncio.create_task(rollout(step, samples)))
                batches[step].set_result((samples, state, task))
            except Exception as exc:  # the trainer waiting on this step hears of it
                batches[step].set_exception(exc)
                raise

    step = run.start
    async with open_session(run.task_to_env, config.rollout.concurrency) as session:
        producer = asyncio.create_task(produce())
        try:
            for step in steps:
                waiting = time.perf_counter()
                samples, state, task = await batches[step]
                result, seconds = await task
                waited = time.perf_counter() - waiting

                def extra(
                    done: Any, dropped: dict[str, int], step: int = step, seconds: float = seconds
                ) -> dict[str, Any]:
                    return {
                        **_lag(done.trajectories, step - 1),
                        "async/max_staleness": k,
                        "async/rollout_seconds": seconds,
                        **ledger.admit(
                            step, done.trajectories, {**dropped, **_dropped(done.trajectories, algo.group_size)}
                        ),
                    }

                metrics = await learn(
                    run,
                    step,
                    await score(run, samples, result),
                    {"wait": waited},
                    push=lambda step=step: _push(run, versions, batches, step),
                    oldest=step - 1 - k,
                    extra=extra,
                    data_state=state,
                )
                await after_step(on_step, step, metrics, run, versions)
                if evaluation_due(run, step):
                    async with versions.pinned() as version:  # no update while the held-out episodes run
                        await evaluate(run, f"step-{step}", version)
        finally:
            for pending in [producer, *rollouts]:
                pending.cancel()
            await asyncio.gather(producer, *rollouts, return_exceptions=True)
    return step


async def _push(run: Run, versions: VersionedBackend, batches: dict[int, asyncio.Future], step: int) -> None:
    """Version ``step``: the weights after step ``step``'s update. Exactly (``exact_staleness``):
    once the batches that generate at the version it replaces, those up to step + k, have finished."""
    algo = run.config.algorithm
    if algo.exact_staleness:
        for later in range(step + 1, min(step + algo.max_staleness, run.config.steps) + 1):
            await (await batches[later])[2]  # (samples, data state, rollout task)
    await versions.advance(lambda: push_weights(run))


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
