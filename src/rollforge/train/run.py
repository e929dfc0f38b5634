"""What both training loops share: a ``Run`` (everything a step uses, set up once by
``run_setup.open_run``), ``draw`` and ``rollout_config`` (a step's prompts and rollout settings),
``score`` (a rollout's rewards), ``push_weights`` (the new weights to the backend), the user's
``on_step`` hook, and the held-out evaluation before, during and after training. The rest of a
step after its scored rollout is ``learn.learn``.

The synchronous loop (``recipes/grpo.py``) and the asynchronous pipeline (``recipes/grpo_async.py``)
both stand on this module and never import each other; ``recipes/launch.py`` picks one per run.

Under torchrun each rank rolls out its share of the groups and the update is sharded with FSDP2
(``distributed.py``); rank 0 logs, evaluates and writes the run directory. A run cancelled
(Ctrl-C) lets the update, weight copy or checkpoint in flight finish first (``uninterrupted``):
no thread is left in torch's native code, and the last checkpoint is whole.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..files import write_json
from ..inputs.data import PromptSource
from ..inputs.evaluate import aevaluate
from ..rollout.checks import CheckedPrompts
from ..rollout.worker_pool import EngineWorkers
from ..seeds import mix
from ..types import Sample
from ..workers import UPDATE_WORKERS
from .config import TrainConfig
from .distributed import Ranks, refresh_copy
from .logbook import Logbook
from .losses import PolicyLoss
from ..inputs.rewards import RewardFunction, compute_rewards, record_unavailable
from .sampling import Scored
from .sync import PolicySync
from .update import TrainedPolicy, UpdateSettings


@dataclass
class Run:
    """Everything a step uses, built once by ``open_run``."""

    config: TrainConfig
    policy: TrainedPolicy  # the trained model (sharded over the ranks when there are several), optimizer, ...
    settings: UpdateSettings  # how every update of the run runs
    generator: Any  # the model object the backend generates from: ``policy.model``, or this rank's plain copy
    tokenizer: Any
    renderer: ChatRenderer
    loss_fn: PolicyLoss
    aggregation: Any
    source: PromptSource
    functions: list[RewardFunction]
    task_to_env: dict[str, Any]
    backend: Backend
    sync: PolicySync
    logbook: Logbook | None  # rank 0's
    start: int  # the last step already done (a resumed run's checkpoint)
    checked: CheckedPrompts  # the prompts as checked before the model loaded: a step passes ``checked.batch(samples)``
    eval_prompts: Sequence[Sample] = ()  # held-out prompts, checked with the training prompts (a ``CheckedBatch``)
    evaluations: dict[str, Any] = field(default_factory=dict)
    workers: EngineWorkers | None = (
        None  # engine worker processes started once (rollout.engine_workers > 1, synchronous)
    )

    @property
    def out(self) -> Path:
        return Path(self.config.out)

    @property
    def model(self) -> Any:
        """The trained policy's model."""
        return self.policy.model

    @property
    def ranks(self) -> Ranks:
        return self.policy.ranks


def draw(run: Run, prompts: int | None = None) -> list[Sample]:
    """The next batch: ``prompts`` prompts (default ``batch_size``), each ``group_size`` times in a row."""
    algo = run.config.algorithm
    count = algo.batch_size if prompts is None else prompts
    return [s for s in run.source.next_batch(count) for _ in range(algo.group_size)]


def rollout_config(run: Run, step: int, share: int, first: int = 0):
    """The step's rollout settings: its sampling seed, and this rank's episode indices (``share``
    episodes per rank) as if the batch were whole, after the ``first`` episodes the step already
    rolled out (dynamic sampling's earlier rounds): every episode of a step has its own seeds."""
    where = {
        "seed": mix(run.config.seed, step),
        "first_index": first + run.ranks.rank * share,
        "infra_retries": run.config.algorithm.infra_retries,
    }
    return run.config.rollout.model_copy(update=where)


async def score(run: Run, samples: Sequence[Sample], result: Any, times: dict[str, float] | None = None) -> Scored:
    """A rolled-out ``result`` of ``samples`` with its rewards (the environments' plus the reward
    functions'); ``times`` (e.g. the rollout's seconds) go with it, and the scoring's own."""
    began = time.perf_counter()
    trajectories = tuple(result.trajectories)
    rewards = await compute_rewards(trajectories, samples, run.functions, run.config.algorithm.env_reward_weight)
    trajectories = tuple(record_unavailable(trajectories, rewards))  # a failed judge: an infra failure, not 0
    return Scored(trajectories, rewards, result.metrics, {**(times or {}), "score": time.perf_counter() - began})


async def after_step(
    on_step: Callable[..., Any] | None, step: int, metrics: dict[str, Any] | None, run: Run, backend: Backend
) -> None:
    """The user's ``on_step(step, metrics, model, backend)`` hook (sync or async), on rank 0 only
    (the rank that has the step's metrics)."""
    if metrics is not None and on_step is not None:
        if inspect.isawaitable(hook := on_step(step, metrics, run.model, backend)):
            await hook


async def uninterrupted(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``function`` on the update thread, finished even when the run is cancelled meanwhile (Ctrl-C):
    the call is bounded (an update, a weight copy, a checkpoint), and a thread abandoned in torch's
    native code aborts the interpreter when it exits (and a checkpoint half-written is lost)."""
    call = asyncio.ensure_future(UPDATE_WORKERS.run(function, *args, **kwargs))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        if not call.cancelled():
            call.exception()  # retrieved: the cancellation is what propagates
        raise


async def push_weights(run: Run) -> None:
    """The new weights to the backend: a rank's plain generation copy takes the gathered weights
    (every rank takes part); each rank's own backend (hf, in-process vLLM) loads them, while servers
    that every rank shares (``openai``) receive them from rank 0 alone and the others wait."""
    if run.generator is not run.model:
        await uninterrupted(refresh_copy, run.generator, run.model)
    if run.ranks.main or run.config.model.backend != "openai":
        await run.sync.push(run.generator)
    run.ranks.barrier()


def evaluation_due(run: Run, step: int) -> bool:
    """Whether a held-out evaluation follows step ``step`` (``eval_every``; the last step's is ``after``)."""
    every = run.config.eval_every
    return bool(run.eval_prompts) and every > 0 and step % every == 0 and step < run.config.steps


async def evaluate(run: Run, when: str, version: int) -> None:
    """Held-out greedy episodes on rank 0 (the others wait), written to ``eval.json`` under ``when``
    with the weight version they ran on (the number of updates behind it)."""
    if run.ranks.main:
        greedy = run.config.rollout.model_copy(update={"greedy": True, "seed": run.config.seed})
        result = await aevaluate(
            run.eval_prompts, run.task_to_env, run.backend, run.renderer, greedy, workers=run.workers
        )
        run.evaluations[when] = {**result.to_json(), "weight_version": version}
        write_json(run.out / "eval.json", run.evaluations)
    run.ranks.barrier()
