"""The GRPO training loop, top to bottom: ``open_run`` sets a run up, ``train_step`` runs one step.

Each step: draw ``batch_size`` prompts, roll each out ``group_size`` times (the engine, async by
default), score every episode (environment reward plus reward functions), turn rewards into
group-relative advantages, take ``epochs_per_batch`` clipped policy-gradient steps whose
importance ratios are taken against the generation logprobs (or corrected for a lag, see
``corrections.py``), push the new weights to the backend, then log and checkpoint. With
``algorithm.max_staleness`` >= 1 generation runs ahead of the update (``pipeline.py``).

Choices made (see the modules for each): one optimizer step per rollout batch by default (fully
on-policy, so the ratio is 1 up to engine/trainer numerics and clipping only guards drift);
failed episodes contribute no tokens to the loss: policy failures keep their reward in the group
statistics, infrastructure failures (a backend, connection or environment failed) are run again
``algorithm.infra_retries`` times, then left out of their group's baseline (advantage 0);
truncated episodes are trained on; sampling
seeds derive from (seed, step, episode index in the global batch), so a resumed run repeats the
uninterrupted run's requests and ranks sample what one process would.
Under torchrun each rank rolls out its share of the groups and the update is sharded with FSDP2
(``distributed.py``); rank 0 logs, evaluates and writes the run directory. A run cancelled (Ctrl-C)
lets the update, weight copy or checkpoint in flight finish first (``uninterrupted``): no thread is
left in torch's native code, and the last checkpoint is whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import torch

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..cluster.generation import open_generation
from ..models import resolve_device
from ..rollout.engine import arollout
from ..types import Sample
from ..workers import UPDATE_WORKERS, run_sync
from . import checkpoint as ckpt
from . import prepare
from .advantages import compute_advantages
from .config import TrainConfig
from .data import PromptSource, check_prompt_lengths
from .distributed import Ranks, refresh_copy, shard
from .environments import build_environments, check_routes, named_environments
from .evaluate import aevaluate
from .generation import backend_config, shared_model
from .logbook import Logbook, read_metrics
from .corrections import Proximal, policy_loss
from .losses import ClippedPolicyLoss, get_aggregation
from .policy import compute_dtype, load_policy, make_optimizer, make_reference
from .rewards import RewardFunction, compute_rewards, load_reward_functions
from .step_metrics import RankStep, merge_ranks, step_metrics
from .sync import WeightSync
from .update import policy_update, sequences
from .versions import fresh_masks


@dataclass(frozen=True)
class TrainResult:
    out: Path
    steps: int  # last step completed
    history: list[dict[str, Any]]
    evaluations: dict[str, Any]  # "before"/"after": held-out greedy EvalResult.to_json()


@dataclass
class Run:
    """Everything a step uses, built once by ``open_run``."""

    config: TrainConfig
    ranks: Ranks
    model: Any  # the trained policy (sharded over the ranks when there are several)
    generator: Any  # the model object the backend generates from: ``model``, or this rank's plain copy
    tokenizer: Any
    renderer: ChatRenderer
    optimizer: torch.optim.Optimizer
    scheduler: Any
    reference: Any
    dtype: torch.dtype  # the update's compute precision
    loss_fn: ClippedPolicyLoss
    aggregation: Any
    source: PromptSource
    functions: list[RewardFunction]
    task_to_env: dict[str, Any]
    backend: Backend
    sync: WeightSync
    logbook: Logbook | None  # rank 0's
    start: int  # the last step already done (a resumed run's checkpoint)
    eval_prompts: list[Sample] = field(default_factory=list)
    evaluations: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return Path(self.config.out)


def train(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """Synchronous façade over ``atrain``; with ``executor: ray`` and ``ray.training_workers`` > 1,
    the ranks run on Ray actors (``cluster/trainers.py``) and this returns rank 0's result."""
    if config.executor == "ray" and config.ray.training_workers > 1 and "WORLD_SIZE" not in os.environ:
        from ..cluster.trainers import train_on_ray

        return train_on_ray(config, **kwargs)
    return run_sync(atrain(config, **kwargs))


async def atrain(
    config: TrainConfig,
    *,
    environments: Any = None,
    dataset: Sequence[dict[str, Any]] | None = None,
    reward_functions: Sequence[RewardFunction] = (),
    resume: bool = False,
    overwrite: bool = False,
    console: bool = True,
    on_step: Callable[..., Any] | None = None,
    backend: Backend | None = None,
) -> TrainResult:
    """Train per ``config``.

    ``environments``: environment objects in addition to the config's names (which then apply only
    when set explicitly, not the default ``arithmetic``): a dict task name -> an environment class,
    a zero-argument factory, a dict ``{name: factory}`` (TRL's multi-environment form) or an
    ``Environment``; or one such object, named after itself. ``on_step(step, metrics, model,
    backend)`` (sync or async) runs after each step's weight sync, e.g. for custom evaluation
    (on rank 0, with the step's global metrics; with ``max_staleness`` >= 1 the backend is the
    versioned one, whose ``pinned()`` holds the weights during an evaluation). ``backend``: a
    ``Backend`` to generate with instead of the one ``model.backend`` opens (whoever opened it
    closes it); it must generate with the trained model object or take ``update_weights``. Without
    ``resume``, an ``out`` that holds a run already is refused, or with ``overwrite`` cleared."""
    async with open_run(config, environments=environments, dataset=dataset, reward_functions=reward_functions,
                        resume=resume, overwrite=overwrite, console=console, backend=backend) as run:
        step = run.start
        if run.eval_prompts and run.start == 0:
            await _evaluate(run, "before", run.start)
        if config.algorithm.max_staleness:
            from .pipeline import train_async

            step = await train_async(run, on_step)
        else:
            for step in range(run.start + 1, config.steps + 1):
                metrics = await train_step(run, step)
                if metrics is not None and on_step is not None:
                    if inspect.isawaitable(hook := on_step(step, metrics, run.model, run.backend)):
                        await hook
        if run.eval_prompts and step == config.steps:
            await _evaluate(run, "after", step)
        return TrainResult(run.out, step, read_metrics(run.out / "metrics.jsonl"), run.evaluations)


async def train_step(run: Run, step: int) -> dict[str, Any] | None:
    """One synchronous step on this rank: its groups of the global batch -> rollout -> ``learn``
    (rank 0 returns the global batch's metrics; other ranks return None)."""
    began = time.perf_counter()
    samples = run.ranks.share(draw(run), run.config.algorithm.group_size)
    result = await arollout(samples, run.task_to_env, run.backend, run.renderer, rollout_config(run, step, len(samples)))
    rolled = time.perf_counter()
    return await learn(run, step, samples, result, {"rollout": rolled - began}, push=lambda: _push_weights(run))


def draw(run: Run) -> list[Sample]:
    """The next batch: ``batch_size`` prompts, each ``group_size`` times in a row."""
    algo = run.config.algorithm
    return [s for s in run.source.next_batch(algo.batch_size) for _ in range(algo.group_size)]


def rollout_config(run: Run, step: int, share: int):
    """The step's rollout settings: its sampling seed, and this rank's episode indices (``share``
    episodes per rank) as if the batch were whole."""
    where = {"seed": run.config.seed * 1_000_003 + step, "first_index": run.ranks.rank * share,
             "infra_retries": run.config.algorithm.infra_retries}
    return run.config.rollout.model_copy(update=where)


async def learn(
    run: Run, step: int, samples: list[Sample], result: Any, times: dict[str, float], *, push: Callable[[], Awaitable[Any]],
    oldest: int | None = None, extra: Callable[[Any, dict[str, int]], dict[str, Any]] | None = None,
    data_state: dict[str, int] | None = None,
) -> dict[str, Any] | None:
    """The rest of a step, on a rolled-out ``result``: rewards -> advantages -> update -> ``push``
    (the weight sync) -> log (rank 0: the global batch's metrics; other ranks return None) ->
    checkpoint. ``oldest``: tokens generated by an older weight version are not trained (they are
    counted). ``extra(done, dropped)``: more metrics for rank 0's line. ``data_state``: the prompt
    source's position to checkpoint (default: now)."""
    config, algo, ranks = run.config, run.config.algorithm, run.ranks
    began = time.perf_counter()
    trajectories = result.trajectories
    rewards = await compute_rewards(trajectories, samples, run.functions, algo.env_reward_weight)
    keep = [t.outcome != "infra_failure" for t in trajectories]  # their reward is unknown, not 0
    advantages = compute_advantages(rewards.totals, algo.group_size, algo.advantage, keep=keep)
    scored = time.perf_counter()

    episodes, owners = sequences(trajectories)  # one per segment, with its episode's advantage
    masks = [e.mask if trajectories[o].error is None else torch.zeros_like(e.mask) for e, o in zip(episodes, owners)]
    stale = 0
    if oldest is not None:
        masks, stale = fresh_masks(masks, owners, trajectories, oldest)
    weights = run.aggregation.weights(masks, ranks.total)  # normalised over the global batch
    shared = algo.group_size if len(episodes) == len(trajectories) else 1  # segments: no shared prompts
    await run.sync.release()  # a colocated engine frees its memory for the update
    proximal = Proximal(len(episodes))  # the weights before this update's logprobs, for a correction that needs them
    for _ in range(algo.epochs_per_batch):
        stats = await uninterrupted(  # its own thread: never behind a hung tool
            policy_update, run.model, run.optimizer, episodes, advantages.values[owners], weights, run.loss_fn,
            micro_batch_tokens=config.optim.micro_batch_tokens, pad_id=run.tokenizer.pad_token_id,
            max_grad_norm=config.optim.max_grad_norm, reference=run.reference, group_size=shared,
            compute_dtype=run.dtype, ranks=ranks, scheduler=run.scheduler, proximal=proximal,
        )
    updated = time.perf_counter()
    await push()
    synced = time.perf_counter()

    times = {**times, "score": scored - began, "update": updated - scored, "sync": synced - updated}
    metrics = None
    if (parts := ranks.gather(RankStep(trajectories, rewards, advantages, stats, result.metrics, times))) is not None:
        done = merge_ranks(parts)  # rank 0: the global batch
        metrics = step_metrics(step, done.trajectories, done.rewards, done.advantages, done.update, done.rollout,
                               lr=run.scheduler.get_last_lr()[0], times=done.times)
        if ranks.distributed:
            metrics["ranks"] = ranks.world
        if extra is not None:
            metrics.update(extra(done, {"stale": stale}))
        run.logbook.log(metrics)
        if config.save_trajectories:
            run.logbook.save_trajectories(step, done.trajectories, done.rewards.totals, done.advantages.values.tolist())
    if step == config.steps or (config.checkpoint_every and step % config.checkpoint_every == 0):
        await uninterrupted(
            ckpt.save_checkpoint, run.out / "checkpoints", step, run.model, run.tokenizer, run.optimizer,
            run.scheduler, data_state or run.source.state(), config.keep_checkpoints, ranks=ranks, plain=run.generator,
        )
    return metrics


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


async def _push_weights(run: Run) -> None:
    """The new weights to the backend: a rank's plain generation copy takes the gathered weights
    (every rank takes part); each rank's own backend (hf, in-process vLLM) loads them, while servers
    that every rank shares (``openai``) receive them from rank 0 alone and the others wait."""
    if run.generator is not run.model:
        await uninterrupted(refresh_copy, run.generator, run.model)
    if run.ranks.main or run.config.model.backend != "openai":
        await run.sync.push(run.generator)
    run.ranks.barrier()


@contextlib.asynccontextmanager
async def open_run(
    config: TrainConfig,
    *,
    environments: Any = None,
    dataset: Sequence[dict[str, Any]] | None = None,
    reward_functions: Sequence[RewardFunction] = (),
    resume: bool = False,
    overwrite: bool = False,
    console: bool = True,
    backend: Backend | None = None,
) -> AsyncIterator[Run]:
    """Set a run up (see ``atrain`` for the arguments) and close what it opened on exit: the
    process group, environments prepare.placed on Ray, the backend, the logbook."""
    out = Path(config.out)
    given = named_environments(environments) if environments is not None else {}
    if given and "environments" not in config.model_fields_set:
        config = config.model_copy(update={"environments": []})  # the objects replace the default
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    local_envs = build_environments(config.environments, given)
    prompts = prepare.prompts(config, list(local_envs), dataset, given)
    check_routes(prompts, local_envs)
    source = PromptSource(prompts, config.seed, config.data.shuffle)
    functions = [*load_reward_functions(config.rewards), *reward_functions]
    resumed = prepare.preflight(config, prompts, resume, overwrite)
    if resumed is not None:
        source.load_state(resumed.data_state)
    async with contextlib.AsyncExitStack() as stack:
        ranks = stack.enter_context(Ranks.open(resolve_device(config.model.device)))
        prepare.check_ranks(config, ranks)
        out.mkdir(parents=True, exist_ok=True)
        if ranks.main:
            prepare.write_config(out, config)
        model, tokenizer = load_policy(config.model, config.lora)
        # a sharded policy cannot generate, nor can one that trains while generation goes on
        # (max_staleness >= 1): the backend generates from a plain copy, refreshed at every sync
        apart = ranks.distributed or (config.algorithm.max_staleness > 0 and backend is None
                                      and config.model.backend == "hf")
        generator = copy.deepcopy(model).requires_grad_(False) if apart else model
        model = shard(model, ranks)
        optimizer, scheduler = make_optimizer(model, config.optim, config.steps * config.algorithm.epochs_per_batch)
        reference = make_reference(model, config.model, config.algorithm.kl_beta, config.lora.enabled)
        algo = config.algorithm
        start = 0
        if resumed is not None:
            ckpt.restore(resumed, model, optimizer, scheduler)
            start = resumed.step
        if ranks.main:
            logbook = Logbook(out, config.steps, start, console)
            stack.callback(logbook.close)
        else:
            logbook = None
        task_to_env = stack.enter_context(prepare.placed(config, local_envs))
        generation = backend_config(config.model, config.rollout, config.ray, config.executor, config.seed,
                                    config.lora.enabled, config.vllm)
        served = backend is None and config.model.backend == "openai"  # by a server we did not start
        if backend is None:
            backend = await stack.enter_async_context(
                open_generation(generation, hf_model=shared_model(generation, generator), tokenizer=tokenizer)
            )
        run = Run(
            config, ranks, model, generator, tokenizer, ChatRenderer(tokenizer), optimizer, scheduler, reference,
            compute_dtype(config.model),
            policy_loss(algo.off_policy_correction, algo.clip_low, algo.clip_high, algo.kl_beta, algo.importance_cap,
                        algo.max_staleness),
            get_aggregation(algo.loss_aggregation,
                            algo.max_loss_tokens or config.rollout.max_new_tokens * config.rollout.max_turns),
            source, functions, task_to_env, backend, WeightSync(backend, generator), logbook, start,
        )
        if start or config.lora.enabled or ranks.distributed or served:
            # a resumed, adapter-wrapped or sharded policy differs from what the engine loaded, and a
            # server may have loaded other weights than model.name (e.g. a warm-up's checkpoint)
            await _push_weights(run)
        run.evaluations = prepare.read_json(out / "eval.json")
        if config.eval_episodes:
            run.eval_prompts = prepare.eval_prompts(config, list(task_to_env), dataset, given)
            check_prompt_lengths(run.eval_prompts, run.renderer, config.rollout.max_seq_len, "rollout.max_seq_len")
        yield run


async def _evaluate(run: Run, when: str, version: int) -> None:
    """Held-out greedy episodes on rank 0 (the others wait), written to ``eval.json`` with the
    weight version they ran on (the number of updates behind it)."""
    if run.ranks.main:
        greedy = run.config.rollout.model_copy(update={"greedy": True, "seed": run.config.seed})
        result = await aevaluate(run.eval_prompts, run.task_to_env, run.backend, run.renderer, greedy)
        run.evaluations[when] = {**result.to_json(), "weight_version": version}
        prepare.write_json(run.out / "eval.json", run.evaluations)
    run.ranks.barrier()
