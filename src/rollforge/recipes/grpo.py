"""The synchronous GRPO loop, top to bottom: ``train_step`` runs one step, ``train_sync`` the steps.

Each step: draw ``batch_size`` prompts, roll each out ``group_size`` times (the engine, async by
default), score every episode (environment reward plus reward functions), turn rewards into
group-relative advantages, take ``epochs_per_batch`` clipped policy-gradient steps whose
importance ratios are taken against the generation logprobs (or corrected for a lag, see
``train/corrections.py``), push the new weights to the backend, then log and checkpoint
(``train/learn.py`` and ``train/run.py``, which the asynchronous pipeline shares). With
``algorithm.max_staleness`` >= 1 generation runs ahead of the update instead (``grpo_async.py``).

Choices made (see the modules for each): one optimizer step per rollout batch by default (fully
on-policy, so the ratio is 1 up to engine/trainer numerics and clipping only guards drift);
failed episodes contribute no tokens to the loss: policy failures keep their reward in the group
statistics, infrastructure failures (a backend, connection or environment failed) are run again
``algorithm.infra_retries`` times, then left out of their group's baseline (advantage 0);
truncated episodes are trained on; sampling
seeds derive from (seed, step, episode index in the global batch), so a resumed run repeats the
uninterrupted run's requests and ranks sample what one process would. With
``algorithm.dynamic_sampling`` (DAPO) a step keeps only groups whose rewards differ and rolls out
more prompts, in at most ``dynamic_sampling_max_rounds`` rounds, to fill the batch
(``train/sampling.py``; one rank only).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

from ..rollout.engine import arollout
from ..train.learn import learn
from ..train.run import Run, after_step, draw, evaluate, evaluation_due, push_weights, rollout_config, score
from ..train.sampling import Scored, fill
from ..types import Sample


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
    engine worker processes, ``run.workers``, if any) and rewards -> ``learn`` (rank 0 returns the
    global batch's metrics; other ranks return None). With dynamic sampling, the rollout rounds that
    fill the batch with groups whose rewards differ (``sampling.fill``)."""
    algo = run.config.algorithm
    if not algo.dynamic_sampling:
        samples = run.ranks.share(draw(run), algo.group_size)
        return await learn(run, step, await roll(run, step, samples), {}, push=lambda: push_weights(run))
    scored, sampling = await fill(
        partial(draw, run),
        partial(roll, run, step),
        batch_size=algo.batch_size,
        group_size=algo.group_size,
        max_rounds=algo.dynamic_sampling_max_rounds,
    )
    return await learn(
        run,
        step,
        scored,
        {},
        push=lambda: push_weights(run),
        extra=lambda done, dropped: sampling.metrics(algo.batch_size),
    )


async def roll(run: Run, step: int, samples: list[Sample], first: int = 0) -> Scored:
    """``samples`` rolled out (their episode indices after the step's ``first`` episodes) and scored."""
    began = time.perf_counter()
    result = await arollout(
        run.checked.batch(samples),  # checked before the model loaded: not again
        run.task_to_env,
        run.backend,
        run.renderer,
        rollout_config(run, step, len(samples), first),
        workers=run.workers,
        on_episode=run.logbook.rolling(len(samples)) if run.logbook is not None else None,  # the heartbeat's count
    )
    return await score(run, samples, result, {"rollout": time.perf_counter() - began})
