"""The GRPO training loop, top to bottom.

Each step: draw ``batch_size`` prompts, roll each out ``group_size`` times (the engine, async by
default), score every episode (environment reward plus reward functions), turn rewards into
group-relative advantages, take ``epochs_per_batch`` clipped policy-gradient steps whose
importance ratios are taken against the generation logprobs, push the new weights to the backend,
then log and checkpoint.

Choices made (see the modules for each): one optimizer step per rollout batch by default (fully
on-policy, so the ratio is 1 up to engine/trainer numerics and clipping only guards drift);
failed episodes (an environment crashed, a backend request failed) keep their reward in the
group statistics but contribute no tokens to the loss; truncated episodes are trained on; sampling
seeds derive from (seed, step), so a resumed run repeats the uninterrupted run's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import yaml

from ..chat.render import ChatRenderer
from ..rollout.engine import arollout
from ..types import Sample
from . import checkpoint as ckpt
from .advantages import compute_advantages
from .config import TrainConfig
from .data import PromptSource, generated_samples, load_rows, rows_to_samples
from .environments import build_environments
from .evaluate import aevaluate
from .logbook import Logbook, read_metrics
from .losses import ClippedPolicyLoss, get_aggregation
from .policy import load_policy, make_optimizer, make_reference
from .rewards import RewardFunction, compute_rewards, load_reward_functions
from .step_metrics import step_metrics
from .sync import WeightSync
from .update import policy_update, sequences


@dataclass(frozen=True)
class TrainResult:
    out: Path
    steps: int  # last step completed
    history: list[dict[str, Any]]
    evaluations: dict[str, Any]  # "before"/"after": held-out greedy EvalResult.to_json()


def train(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """Synchronous façade over ``atrain``."""
    return asyncio.run(atrain(config, **kwargs))


async def atrain(
    config: TrainConfig,
    *,
    dataset: Sequence[dict[str, Any]] | None = None,
    reward_functions: Sequence[RewardFunction] = (),
    resume: bool = False,
    console: bool = True,
    on_step: Callable[..., Any] | None = None,
) -> TrainResult:
    """Train per ``config``. ``on_step(step, metrics, model, backend)`` (sync or async) runs after
    each step's weight sync, e.g. for custom evaluation."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    random.seed(config.seed)
    torch.manual_seed(config.seed)

    local_envs = build_environments(config.environments)
    prompts = _prompts(config, list(local_envs), dataset)
    source = PromptSource(prompts, config.seed, config.data.shuffle)
    functions = [*load_reward_functions(config.rewards), *reward_functions]
    model, tokenizer = load_policy(config)
    renderer = ChatRenderer(tokenizer)
    optimizer, scheduler = make_optimizer(model, config)
    reference = make_reference(model, config)
    algo = config.algorithm
    loss_fn = ClippedPolicyLoss(algo.clip_low, algo.clip_high, algo.kl_beta)
    aggregation = get_aggregation(
        algo.loss_aggregation, algo.max_loss_tokens or config.rollout.max_new_tokens * config.rollout.max_turns
    )

    start = 0
    latest = ckpt.latest_checkpoint(out / "checkpoints") if resume else None
    if latest is not None:
        restored = ckpt.restore_checkpoint(latest, model, optimizer, scheduler)
        source.load_state(restored.data_state)
        start = restored.step
    logbook = Logbook(out, config.steps, start, console)
    placement = contextlib.ExitStack()  # environments on Ray actors stop with the run
    task_to_env = placement.enter_context(_placed(config, local_envs))
    backend = None
    try:
        backend = _open_backend(config, model, tokenizer)
        sync = WeightSync(backend, model)
        if start or config.lora.enabled:
            await sync.push(model)  # a resumed or adapter-wrapped policy differs from what the engine loaded
        evaluations = _read_json(out / "eval.json")
        eval_prompts = _eval_prompts(config, list(task_to_env), dataset) if config.eval_episodes else []
        step = start
        if eval_prompts and start == 0:
            evaluations = {"before": await _evaluate(eval_prompts, task_to_env, backend, renderer, config)}
            _write_json(out / "eval.json", evaluations)
        for step in range(start + 1, config.steps + 1):
            began = time.perf_counter()
            samples = [s for s in source.next_batch(algo.batch_size) for _ in range(algo.group_size)]
            rollout_config = config.rollout.model_copy(update={"seed": config.seed * 1_000_003 + step})
            result = await arollout(samples, task_to_env, backend, renderer, rollout_config)
            trajectories = result.trajectories
            rewards = await compute_rewards(trajectories, samples, functions, algo.env_reward_weight)
            advantages = compute_advantages(rewards.totals, algo.group_size, algo.advantage)
            rolled = time.perf_counter()

            episodes, owners = sequences(trajectories)  # one per segment, with its episode's advantage
            masks = [e.mask if trajectories[o].error is None else torch.zeros_like(e.mask) for e, o in zip(episodes, owners)]
            weights = aggregation.weights(masks)
            shared = algo.group_size if len(episodes) == len(trajectories) else 1  # segments: no shared prompts
            for _ in range(algo.epochs_per_batch):
                stats = await asyncio.to_thread(
                    policy_update, model, optimizer, episodes, advantages.values[owners], weights, loss_fn,
                    micro_batch_tokens=config.optim.micro_batch_tokens, pad_id=tokenizer.pad_token_id,
                    max_grad_norm=config.optim.max_grad_norm, reference=reference, group_size=shared,
                )
                scheduler.step()
            updated = time.perf_counter()
            await sync.push(model)
            synced = time.perf_counter()

            metrics = step_metrics(
                step, trajectories, rewards, advantages, stats, result.metrics,
                lr=scheduler.get_last_lr()[0],
                times={"rollout": rolled - began, "update": updated - rolled, "sync": synced - updated},
            )
            logbook.log(metrics)
            if on_step is not None and inspect.isawaitable(hook := on_step(step, metrics, model, backend)):
                await hook
            if config.save_trajectories:
                logbook.save_trajectories(step, trajectories, rewards.totals, advantages.values.tolist())
            if step == config.steps or (config.checkpoint_every and step % config.checkpoint_every == 0):
                ckpt.save_checkpoint(
                    out / "checkpoints", step, model, tokenizer, optimizer, scheduler, source.state(),
                    config.keep_checkpoints,
                )
        if eval_prompts and step == config.steps:
            evaluations["after"] = await _evaluate(eval_prompts, task_to_env, backend, renderer, config)
            _write_json(out / "eval.json", evaluations)
    finally:
        logbook.close()
        if backend is not None:
            await backend.close()
        placement.close()
    return TrainResult(out, step, read_metrics(out / "metrics.jsonl"), evaluations)


async def _evaluate(prompts, task_to_env, backend, renderer, config: TrainConfig) -> dict[str, Any]:
    greedy = config.rollout.model_copy(update={"greedy": True, "seed": config.seed})
    result = await aevaluate(prompts, task_to_env, backend, renderer, greedy)
    return result.to_json()


def _eval_prompts(config: TrainConfig, tasks: list[str], dataset) -> list[Sample]:
    """Held-out prompts from the generators (another seed); with a dataset, its first rows."""
    if dataset is not None or config.data.path is not None:
        return _prompts(config, tasks, dataset)[: config.eval_episodes]
    return generated_samples(config.environments, config.eval_episodes, config.seed + 7919)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _prompts(config: TrainConfig, tasks: list[str], dataset: Sequence[dict[str, Any]] | None) -> list[Sample]:
    if dataset is not None:
        return rows_to_samples(dataset, tasks, config.data.system_prompt)
    if config.data.path is not None:
        return rows_to_samples(load_rows(config.data.path), tasks, config.data.system_prompt)
    return generated_samples(config.environments, config.data.size, config.seed)


def _placed(config: TrainConfig, task_to_env: dict[str, Any]):
    """The environments where ``executor`` says they run."""
    if config.executor == "ray":
        from ..cluster.executor import environments_on_ray

        return environments_on_ray(task_to_env, config.ray)
    return contextlib.nullcontext(task_to_env)


def _open_backend(config: TrainConfig, model: Any, tokenizer: Any):
    from ..backends.select import open_backend

    kind = config.model.backend
    options = {"enable_lora": True} if kind == "vllm" and config.lora.enabled else None
    replicas = config.ray.generation_replicas if config.executor == "ray" else 1
    return open_backend(
        kind, config.model.name, tokenizer, base_url=config.model.base_url,
        hf_model=model if replicas == 1 else None, served_model_name=config.model.served_model_name,
        concurrency=config.rollout.concurrency, seed=config.seed, options=options,
        replicas=replicas, replica_cpus=config.ray.replica_cpus, replica_gpus=config.ray.replica_gpus,
    )
