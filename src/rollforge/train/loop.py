"""The synchronous GRPO loop, top to bottom: ``train_step`` runs one step, ``train_sync`` the steps.

Each step: draw ``batch_size`` prompts, roll each out ``group_size`` times (the engine, async by
default), score every episode (environment reward plus reward functions), turn rewards into
group-relative advantages, take ``epochs_per_batch`` clipped policy-gradient steps whose
importance ratios are taken against the generation logprobs (or corrected for a lag, see
``corrections.py``), push the new weights to the backend, then log and checkpoint (``run.py``,
which the asynchronous pipeline shares). With ``algorithm.max_staleness`` >= 1 generation runs
ahead of the update instead (``pipeline.py``).

Choices made (see the modules for each): one optimizer step per rollout batch by default (fully
on-policy, so the ratio is 1 up to engine/trainer numerics and clipping only guards drift);
failed episodes contribute no tokens to the loss: policy failures keep their reward in the group
statistics, infrastructure failures (a backend, connection or environment failed) are run again
``algorithm.infra_retries`` times, then left out of their group's baseline (advantage 0);
truncated episodes are trained on; sampling
seeds derive from (seed, step, episode index in the global batch), so a resumed run repeats the
uninterrupted run's requests and ranks sample what one process would.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..rollout.engine import arollout
from .run import Run, after_step, draw, evaluate, evaluation_due, learn, push_weights, rollout_config


async def train_sync(run: Run, on_step: Callable[..., Any] | None = None) -> int:
    """Steps ``run.start + 1 .. config.steps``, each rolled out, then learned from; returns the last
    step done. ``on_step(step, metrics, model, backend)`` runs after each step's weight sync."""
    step = run.start
    for step in range(run.start + 1, run.config.steps + 1):
        await after_step(on_step, step, await train_step(run, step), run, run.backend)
        if evaluation_due(run, step):
            await evaluate(run, f"step-{step}", step)
    return step


async def train_step(run: Run, step: int) -> dict[str, Any] | None:
    """One synchronous step on this rank: its groups of the global batch -> rollout (on the run's
    engine worker processes, ``run.workers``, if any) -> ``learn`` (rank 0 returns the global
    batch's metrics; other ranks return None)."""
    began = time.perf_counter()
    samples = run.ranks.share(draw(run), run.config.algorithm.group_size)
    result = await arollout(samples, run.task_to_env, run.backend, run.renderer, rollout_config(run, step, len(samples)),
                            workers=run.workers)
    rolled = time.perf_counter()
    return await learn(run, step, samples, result, {"rollout": rolled - began}, push=lambda: push_weights(run))
