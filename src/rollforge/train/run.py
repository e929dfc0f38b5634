"""What both training loops share: a ``Run`` (everything a step uses, set up once by ``open_run``),
``draw`` and ``rollout_config`` (a step's prompts and rollout settings), ``score`` (a rollout's
rewards), ``learn`` (the rest of a step after its scored rollout), ``push_weights`` (the new
weights to the backend) and the held-out evaluation before and after training.

The synchronous loop (``recipes/grpo.py``) and the asynchronous pipeline (``recipes/grpo_async.py``)
both stand on this module and never import each other; ``recipes/launch.py`` picks one per run.
Environments and prompts are read through ``inputs.read.read_inputs``; environment objects given to
``train()`` replace the default environments (``given_environments``).

Setup reads its inputs before the model loads, so that a refusal (a prompt too long, a server that
does not answer, a run directory in the way) is quick. Under torchrun each rank rolls out its share
of the groups and the update is sharded with FSDP2 (``distributed.py``); rank 0 logs, evaluates and
writes the run directory. A run cancelled (Ctrl-C) lets the update, weight copy or checkpoint in
flight finish first (``uninterrupted``): no thread is left in torch's native code, and the last
checkpoint is whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import torch

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..cluster.executor import placed
from ..cluster.generation import open_generation
from ..files import read_json, write_json
from ..inputs.data import PromptSource
from ..inputs.environments import named_environments
from ..inputs.evaluate import aevaluate
from ..inputs.read import held_out, read_inputs, read_samples, training_prompts
from ..models import resolve_device
from ..rollout.checks import check_prompt_lengths
from ..rollout.worker_pool import EngineWorkers
from ..seeds import mix
from ..types import Sample
from ..workers import UPDATE_WORKERS
from . import checkpoint as ckpt
from .advantages import compute_advantages
from .config import TrainConfig
from .corrections import Proximal
from .distributed import Ranks, refresh_copy, shard
from .generation_backend import backend_config, shared_model
from .logbook import Logbook
from .losses import PolicyLoss, get_aggregation
from .micro_batches import shares_prompts
from .policy import compute_dtype, load_policy, make_optimizer, make_reference
from .policy_losses import policy_loss
from .preflight import check_ranks, preflight, write_config
from .rewards import RewardFunction, compute_rewards, load_reward_functions, record_unavailable
from .sampling import Scored, known
from .step_metrics import RankStep, merge_ranks, step_metrics
from .sync import PolicySync
from .update import policy_update, sequences
from .versions import fresh_masks


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
    loss_fn: PolicyLoss
    aggregation: Any
    source: PromptSource
    functions: list[RewardFunction]
    task_to_env: dict[str, Any]
    backend: Backend
    sync: PolicySync
    logbook: Logbook | None  # rank 0's
    start: int  # the last step already done (a resumed run's checkpoint)
    eval_prompts: list[Sample] = field(default_factory=list)
    evaluations: dict[str, Any] = field(default_factory=dict)
    workers: EngineWorkers | None = (
        None  # engine worker processes started once (rollout.engine_workers > 1, synchronous)
    )

    @property
    def out(self) -> Path:
        return Path(self.config.out)


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


async def learn(
    run: Run,
    step: int,
    scored: Scored,
    times: dict[str, float],
    *,
    push: Callable[[], Awaitable[Any]],
    oldest: int | None = None,
    extra: Callable[[Any, dict[str, int]], dict[str, Any]] | None = None,
    data_state: dict[str, int] | None = None,
) -> dict[str, Any] | None:
    """The rest of a step, on a ``scored`` batch (``score``): advantages -> update -> ``push``
    (the weight sync) -> log (rank 0: the global batch's metrics; other ranks return None) ->
    checkpoint. ``oldest``: tokens generated by an older weight version are not trained (they are
    counted). ``extra(done, dropped)``: more metrics for rank 0's line. ``data_state``: the prompt
    source's position to checkpoint (default: now)."""
    config, algo, ranks = run.config, run.config.algorithm, run.ranks
    began = time.perf_counter()
    trajectories, rewards = scored.trajectories, scored.rewards
    advantages = compute_advantages(rewards.totals, algo.group_size, algo.advantage, keep=known(trajectories))

    episodes, owners = sequences(trajectories)  # one per segment, with its episode's advantage
    masks = [e.mask if trajectories[o].error is None else torch.zeros_like(e.mask) for e, o in zip(episodes, owners)]
    stale = 0
    if oldest is not None:
        masks, stale = fresh_masks(masks, owners, trajectories, oldest)
    weights = run.aggregation.weights(masks, ranks.total)  # normalised over the global batch
    device = next(run.model.parameters()).device
    sharing = len(episodes) == len(trajectories) and shares_prompts(config.optim.share_prompts, device)
    shared = algo.group_size if sharing else 1  # segments of rewritten histories share no prompt
    await run.sync.release()  # a colocated engine frees its memory for the update
    proximal = Proximal(len(episodes))  # the weights before this update's logprobs, for a correction that needs them
    for _ in range(algo.epochs_per_batch):
        stats = await uninterrupted(  # its own thread: never behind a hung tool
            policy_update,
            run.model,
            run.optimizer,
            episodes,
            advantages.values[owners],
            weights,
            run.loss_fn,
            micro_batch_tokens=config.optim.micro_batch_tokens,
            pad_id=run.tokenizer.pad_token_id,
            max_grad_norm=config.optim.max_grad_norm,
            reference=run.reference,
            group_size=shared,
            compute_dtype=run.dtype,
            ranks=ranks,
            scheduler=run.scheduler,
            proximal=proximal,
            skip_zero_advantage=algo.skip_zero_advantage,
        )
    updated = time.perf_counter()
    await push()
    synced = time.perf_counter()

    times = {**times, **scored.times, "update": updated - began, "sync": synced - updated}
    metrics = None
    if (parts := ranks.gather(RankStep(trajectories, rewards, advantages, stats, scored.rollout, times))) is not None:
        done = merge_ranks(parts)  # rank 0: the global batch
        metrics = step_metrics(
            step,
            done.trajectories,
            done.rewards,
            done.advantages,
            done.update,
            done.rollout,
            lr=run.scheduler.get_last_lr()[0],
            times=done.times,
        )
        if ranks.distributed:
            metrics["ranks"] = ranks.world
        if extra is not None:
            metrics.update(extra(done, {"stale": stale}))
        run.logbook.log(metrics)
        if config.save_trajectories:
            run.logbook.save_trajectories(step, done.trajectories, done.rewards.totals, done.advantages.values.tolist())
    if step == config.steps or (config.checkpoint_every and step % config.checkpoint_every == 0):
        await uninterrupted(
            ckpt.save_checkpoint,
            run.out / "checkpoints",
            step,
            run.model,
            run.tokenizer,
            run.optimizer,
            run.scheduler,
            data_state or run.source.state(),
            config.keep_checkpoints,
            ranks=ranks,
            plain=run.generator,
        )
    return metrics


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
    process group, environments placed on Ray, the backend, the logbook."""
    config, given = given_environments(config, environments)
    local_envs, source, functions, resumed = _read_inputs(config, given, dataset, reward_functions, resume, overwrite)
    async with contextlib.AsyncExitStack() as stack:
        ranks = stack.enter_context(Ranks.open(resolve_device(config.model.device)))
        check_ranks(config, ranks)
        Path(config.out).mkdir(parents=True, exist_ok=True)
        if ranks.main:
            write_config(Path(config.out), config)
        logbook = _open_logbook(stack, config, ranks, resumed.step if resumed is not None else 0, console)
        model, generator, tokenizer = _load_policy(config, ranks, backend)
        optimizer, scheduler = make_optimizer(model, config.optim, config.steps * config.algorithm.epochs_per_batch)
        reference = make_reference(model, config.model, config.algorithm.kl_beta, config.lora.enabled)
        start = 0
        if resumed is not None:
            ckpt.restore(resumed, model, optimizer, scheduler)
            start = resumed.step
        task_to_env = stack.enter_context(placed(local_envs, config.ray if config.executor == "ray" else None))
        served = backend is None and config.model.backend == "openai"  # by a server we did not start
        if backend is None:
            backend = await _open_backend(stack, config, generator, tokenizer)
        loss_fn, aggregation = _objective(config)
        run = Run(
            config=config,
            ranks=ranks,
            model=model,
            generator=generator,
            tokenizer=tokenizer,
            renderer=ChatRenderer(tokenizer),
            optimizer=optimizer,
            scheduler=scheduler,
            reference=reference,
            dtype=compute_dtype(config.model),
            loss_fn=loss_fn,
            aggregation=aggregation,
            source=source,
            functions=functions,
            task_to_env=task_to_env,
            backend=backend,
            sync=PolicySync(backend, generator),
            logbook=logbook,
            start=start,
        )
        if start or config.lora.enabled or ranks.distributed or served:
            # a resumed, adapter-wrapped or sharded policy differs from what the engine loaded, and a
            # server may have loaded other weights than model.name (e.g. a warm-up's checkpoint)
            await push_weights(run)
        if config.rollout.engine_workers > 1 and not config.algorithm.max_staleness:  # every rollout and evaluation
            run.workers = await stack.enter_async_context(
                EngineWorkers(config.rollout.engine_workers, task_to_env, backend, run.renderer)
            )
        _read_evaluations(run, dataset, given)
        yield run


def given_environments(config: TrainConfig, environments: Any) -> tuple[TrainConfig, dict[str, Any]]:
    """The environment objects given to ``train()`` by task name, and the config the run reads them
    with: given objects replace the default environments (not those the config sets itself)."""
    given = named_environments(environments) if environments is not None else {}
    if given and "environments" not in config.model_fields_set:
        config = config.model_copy(update={"environments": []})  # the objects replace the default
    return config, given


def _read_inputs(
    config: TrainConfig,
    given: dict[str, Any],
    dataset: Sequence[dict[str, Any]] | None,
    reward_functions: Sequence[RewardFunction],
    resume: bool,
    overwrite: bool,
) -> tuple[dict[str, Any], PromptSource, list[RewardFunction], ckpt.Loaded | None]:
    """What the run reads before the model loads: the environments by task, the prompt source (at
    the checkpoint's position when resuming), the reward functions, and the checkpoint to resume."""
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    local_envs, prompts = read_inputs(config.environments, training_prompts(config.data, config.seed, dataset), given)
    source = PromptSource(prompts, config.seed, config.data.shuffle)
    functions = [*load_reward_functions(config.rewards), *reward_functions]
    resumed = preflight(config, prompts, resume, overwrite)
    if resumed is not None:
        source.load_state(resumed.data_state)
    return local_envs, source, functions, resumed


def _load_policy(config: TrainConfig, ranks: Ranks, backend: Backend | None) -> tuple[Any, Any, Any]:
    """The policy (sharded over the ranks), the model object generation uses, and the tokenizer."""
    model, tokenizer = load_policy(config.model, config.lora)
    # a sharded policy cannot generate, nor can one that trains while generation goes on
    # (max_staleness >= 1): the backend generates from a plain copy, refreshed at every sync
    apart = ranks.distributed or (
        config.algorithm.max_staleness > 0 and backend is None and config.model.backend == "hf"
    )
    generator = copy.deepcopy(model).requires_grad_(False) if apart else model
    return shard(model, ranks), generator, tokenizer


def _open_logbook(
    stack: contextlib.AsyncExitStack, config: TrainConfig, ranks: Ranks, start: int, console: bool
) -> Logbook | None:
    """Rank 0's logbook, closed with the run; the other ranks log nothing. Opened before the model
    loads: a tracker of ``report_to`` that is not installed or cannot start its run fails quickly."""
    if not ranks.main:
        return None
    logbook = Logbook(
        Path(config.out),
        config.steps,
        start,
        console,
        report_to=config.report_to,
        config=config.model_dump(mode="json"),
    )
    stack.callback(logbook.close)
    return logbook


async def _open_backend(
    stack: contextlib.AsyncExitStack, config: TrainConfig, generator: Any, tokenizer: Any
) -> Backend:
    """The backend ``model.backend`` names, generating from ``generator`` when it runs in process."""
    generation = backend_config(
        config.model, config.rollout, config.ray, config.executor, config.seed, config.lora.enabled, config.vllm
    )
    return await stack.enter_async_context(
        open_generation(generation, hf_model=shared_model(generation, generator), tokenizer=tokenizer)
    )


def _objective(config: TrainConfig) -> tuple[PolicyLoss, Any]:
    """The policy loss (with its off-policy correction: ``auto`` corrects where generation runs on
    older weights or another engine than the update) and how it aggregates over tokens."""
    algo = config.algorithm
    loss_fn = policy_loss(
        algo.policy_loss,
        correction=algo.off_policy_correction,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        kl_beta=algo.kl_beta,
        cap=algo.importance_cap,
        max_staleness=algo.max_staleness,
        backend=config.model.backend,
    )
    longest = algo.max_loss_tokens or config.rollout.max_new_tokens * config.rollout.max_turns
    return loss_fn, get_aggregation(algo.loss_aggregation, longest)


def _read_evaluations(run: Run, dataset: Sequence[dict[str, Any]] | None, given: dict[str, Any]) -> None:
    """The evaluations already written (a resumed run's ``before``) and the held-out prompts."""
    config = run.config
    run.evaluations = read_json(run.out / "eval.json")
    if config.eval_episodes:
        prompts = held_out(training_prompts(config.data, config.seed, dataset), config.eval_episodes)
        run.eval_prompts = read_samples(config.environments, prompts, list(run.task_to_env), given)
        check_prompt_lengths(run.eval_prompts, run.renderer, config.rollout.max_seq_len, "rollout.max_seq_len")


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
