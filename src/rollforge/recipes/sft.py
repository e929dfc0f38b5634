"""Supervised fine-tuning on trajectories, top to bottom.

The loss is the mean negative log-likelihood of the tokens whose loss mask is 1 -- exactly the
tokens the RL trainer trains on (the policy's own: assistant content and its end-of-turn token;
never prompt, template, tool or environment tokens)::

    loss = -(1 / N) * sum over mask-1 tokens t of log p(ids[t] | ids[:t])     N = mask-1 tokens in the batch

One step, the loss and the update that descends it, is ``sft_step`` (re-exported here). It shares
the GRPO trainer's parts (``train/``): model loading, precision and LoRA (``policy``),
token-budget micro-batches and the masked logprob pass (``update``: the vocabulary projection runs
only where a mask-1 token is predicted), gradient accumulation with weights computed for the whole
batch (so packing does not change the gradient), clipping, AdamW and its schedule, checkpoints
(``checkpoint``) and ``metrics.jsonl`` (``logbook``).

Phases: the configured ``sources`` first (trajectory files filtered by ``min_reward``,
conversations, expert demonstrations), then, with ``from_rollouts.enabled``, ``rounds`` of
rejection sampling: roll out the current model ``samples_per_prompt`` times per prompt, keep the
episodes with reward >= ``min_reward``, train on them (expert iteration when rounds > 1); its
environments and prompts are read as every run's are (``inputs.read.read_inputs``). Each phase is
``epochs`` passes over its examples in a seeded order, ``batch_size`` examples per step.

A vision-language model (a ``model.name`` whose directory has a processor, ``models.load_text_side``)
trains on examples that show images: the renderer is a ``VisionRenderer``, each example keeps the
images its ids show (``sft_data``), the forward pass gets their pixels through the GRPO update's
image path (``train.vision.batch_logprobs``), and checkpoints save the processor with the model.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ..chat.render import ChatRenderer
from ..chat.vision import renderer_for
from ..errors import ConfigError
from ..inputs.read import Prompts, read_inputs
from ..models import load_text_side
from ..rollout.engine import arollout
from ..seeds import held_out_seed, mix
from ..train import checkpoint as ckpt
from ..train.config_files import check_unchanged
from ..train.logbook import Logbook, read_metrics
from ..train.micro_batches import micro_batch_tokens_for
from ..train.policy import compute_dtype, load_policy, make_optimizer
from ..train.preflight import write_config
from ..train.update import TrainedPolicy
from ..types import Trajectory
from ..workers import run_sync
from .sft_config import MessagesSource, SFTConfig, TrajectoriesSource
from .sft_data import (
    Example,
    expert_demonstrations,
    message_rows,
    read_records,
    record_examples,
    row_examples,
    select_trajectories,
    trajectory_examples,
)
from .sft_step import MaskedNLLLoss, SFTStats, sft_loss, sft_update

__all__ = ["MaskedNLLLoss", "SFTResult", "SFTStats", "asft", "rejection_sample", "sft", "sft_loss", "sft_update"]


@dataclass(frozen=True)
class SFTResult:
    out: Path
    steps: int
    history: list[dict[str, Any]]


# -- the run ---------------------------------------------------------------------------------------


def sft(config: SFTConfig, **kwargs: Any) -> SFTResult:
    """Synchronous façade over ``asft`` (runs its own event loop, also in a notebook)."""
    return run_sync(asft(config, **kwargs))


async def asft(
    config: SFTConfig,
    *,
    dataset: Sequence[Mapping[str, Any]] | None = None,
    trajectories: Sequence[Trajectory] | None = None,
    console: bool = True,
    overwrite: bool = False,
    resume: bool = False,
) -> SFTResult:
    """Fine-tune per ``config``. ``dataset``: in-memory conversation rows (a ``messages`` column),
    ``trajectories``: in-memory episodes (kept as they are); both join the configured sources.
    An ``out`` that holds a run already is refused, or with ``overwrite`` cleared; with ``resume``
    the run continues after its newest checkpoint (``_resumed``)."""
    out = Path(config.out)
    resumed = _resumed(out, config, resume, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, config)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    tokenizer, processor = load_text_side(config.model.name)  # a vision-language model's: its processor's
    renderer = renderer_for(processor or tokenizer)
    model, tokenizer = load_policy(config.model, config.lora, tokenizer)
    examples = await _source_examples(config, renderer, dataset, trajectories)
    total = _planned_steps(config, len(examples))
    optimizer, scheduler = make_optimizer(model, config.optim, max(total, 1))
    done = 0
    if resumed is not None:
        done = resumed.step
        if done > min(_steps(len(examples), config), total):  # a round's rollout ran on weights now gone
            raise ConfigError(
                f"cannot resume {str(out)!r} after step {done}: it is inside the rejection-sampling rounds, which "
                "resume only from the sources' steps; start over with --overwrite"
            )
        ckpt.restore(resumed, model, optimizer, scheduler)
    logbook = Logbook(out, total, done, console=console)
    try:
        trainer = _Trainer(config, model, renderer, optimizer, scheduler, logbook, total, done)
        step = trainer.train(examples, phase=0, step=0) if examples else 0
        step = await trainer.rejection_rounds(step)
        if step > done:
            trainer.checkpoint(step)
    finally:
        logbook.close()
    return SFTResult(out, step, read_metrics(out / "metrics.jsonl"))


def _resumed(out: Path, config: SFTConfig, resume: bool, overwrite: bool) -> ckpt.Loaded | None:
    """The checkpoint a ``resume`` continues from (its config unchanged but for ``RESUMABLE`` keys),
    or None: a fresh start, into an ``out`` that holds no run (``overwrite``: deleting it)."""
    if resume and overwrite:
        raise ConfigError(
            "resume and overwrite exclude each other: continue the run in out, or delete it and start over"
        )
    if not resume:
        ckpt.start_fresh(out, overwrite)
        return None
    if ckpt.recorded(out) is not None:
        check_unchanged(out, config)
    return ckpt.resumable(out)


def _planned_steps(config: SFTConfig, n_examples: int) -> int:
    """The run's steps: the sources' epochs, then each rejection-sampling round's (as if it kept
    every episode), at most ``max_steps``."""
    rounds = config.from_rollouts.rounds if config.from_rollouts.enabled else 0
    if not n_examples and not rounds:
        raise ConfigError("nothing to train on: give sources (trajectories, messages, expert) or enable from_rollouts")
    per_round = config.from_rollouts.prompts * config.from_rollouts.samples_per_prompt
    planned = _steps(n_examples, config) + rounds * _steps(per_round, config)
    return min(planned, config.max_steps or planned)


def _steps(n_examples: int, config: SFTConfig) -> int:
    return math.ceil(n_examples / config.batch_size) * config.epochs


async def _source_examples(config: SFTConfig, renderer: ChatRenderer, dataset, trajectories) -> list[Example]:
    parser = renderer.parser(config.rollout.tool_parser)
    examples: list[Example] = []
    for n, source in enumerate(config.sources):
        if isinstance(source, TrajectoriesSource):
            found = record_examples(read_records(source.path), source.min_reward, renderer.images)
        elif isinstance(source, MessagesSource):
            found = row_examples(renderer, message_rows(source.path), source.column, parser)
        else:  # ExpertSource
            result = await expert_demonstrations(
                source.env, source.episodes, renderer, config.rollout, seed=config.seed + n, options=source.options
            )
            kept = select_trajectories(result.trajectories, source.min_reward)
            found = [e for t in kept for e in trajectory_examples(t, renderer.images)]
            if not found:
                best = max(t.total_reward for t in result.trajectories)
                raise ConfigError(
                    f"sources[{n}]: none of the {source.episodes} {source.env} demonstrations reached min_reward "
                    f"{source.min_reward} (best {best}); the expert may need more rollout.max_turns or max_new_tokens"
                )
        if not found:
            raise ConfigError(f"sources[{n}] ({source.kind}) gave no examples; check its path and min_reward")
        examples += found
    if dataset is not None:
        examples += row_examples(renderer, dataset, parser=parser)
    if trajectories is not None:
        examples += [e for t in trajectories for e in trajectory_examples(t, renderer.images)]
    return examples


async def rejection_sample(config: SFTConfig, model: Any, renderer: ChatRenderer, phase: int):
    """Roll out the current model ``samples_per_prompt`` times per prompt: the rollout, the episodes
    whose total reward is >= ``min_reward`` (and that did not fail), and the round's metrics."""
    from ..backends.opening import open_backend
    from ..cluster.config import RayConfig
    from ..train.generation_backend import backend_config

    rollouts = config.from_rollouts
    task_to_env, prompts = read_inputs(
        rollouts.environments, Prompts(generated=rollouts.prompts, seed=held_out_seed(config.seed, phase))
    )
    samples = [s for s in prompts for _ in range(rollouts.samples_per_prompt)]
    generation = backend_config(config.model, config.rollout, RayConfig(), "local", config.seed, config.lora.enabled)
    processor = renderer.images.processor if renderer.images is not None else None
    async with open_backend(generation, hf_model=model, tokenizer=renderer.tokenizer, processor=processor) as backend:
        if config.model.backend != "hf":
            await backend.update_weights(model)
        rollout_config = config.rollout.model_copy(update={"seed": mix(config.seed, phase)})
        result = await arollout(samples, task_to_env, backend, renderer, rollout_config)
    kept = select_trajectories(result.trajectories, rollouts.min_reward)
    metrics = {f"rollout/{k}": v for k, v in result.metrics.items() if isinstance(v, (int, float)) or v is None}
    metrics.update({"rollout/episodes": len(samples), "rollout/kept": len(kept)})
    return result, kept, metrics


class _Trainer:
    """Epochs of seeded batches over one phase's examples; logs and checkpoints each step."""

    def __init__(
        self, config: SFTConfig, model, renderer: ChatRenderer, optimizer, scheduler, logbook: Logbook, total, done=0
    ):
        self.config, self.model, self.renderer, self.tokenizer = config, model, renderer, renderer.tokenizer
        self.optimizer, self.scheduler, self.logbook = optimizer, scheduler, logbook
        self.total, self.done = total, done  # done: the steps a resumed run's checkpoint holds
        self.micro_batch_tokens = micro_batch_tokens_for(config.optim.micro_batch_tokens, model)

    def train(self, examples: Sequence[Example], *, phase: int, step: int, extra: Mapping[str, Any] = {}) -> int:
        """Train on ``examples``; ``extra`` metrics (a round's rollout) join the first step's line."""
        config = self.config
        for epoch in range(config.epochs):
            order = list(range(len(examples)))
            if config.shuffle:
                random.Random(f"{config.seed}:{phase}:{epoch}").shuffle(order)
            for start in range(0, len(order), config.batch_size):
                if step >= self.total:
                    return step
                if step < self.done:  # trained before the resume: the same seeded order, so the same batch
                    step += 1
                    continue
                began = time.perf_counter()
                batch = [examples[i] for i in order[start : start + config.batch_size]]
                stats = sft_update(
                    self.model,
                    self.optimizer,
                    batch,
                    micro_batch_tokens=self.micro_batch_tokens,
                    pad_id=self.tokenizer.pad_token_id,
                    max_grad_norm=config.optim.max_grad_norm,
                    compute_dtype=compute_dtype(config.model),
                    scheduler=self.scheduler,
                )
                step += 1
                metrics = {
                    "step": step,
                    "phase": phase,
                    "epoch": epoch,
                    "loss": stats.loss,
                    "grad_norm": stats.grad_norm,
                    "lr": self.scheduler.get_last_lr()[0],
                    "examples": len(batch),
                    "tokens": stats.tokens,
                    "loss_tokens": stats.loss_tokens,
                    "micro_batches": stats.micro_batches,
                    "time/step": time.perf_counter() - began,
                    **extra,
                }
                extra = {}
                self.logbook.log(metrics)  # its console line: logbook.sft_line
                if config.checkpoint_every and step % config.checkpoint_every == 0 and step < self.total:
                    self.checkpoint(step)
        return step

    async def rejection_rounds(self, step: int) -> int:
        """``from_rollouts``' rounds after ``step``: each rolls out the current model (its episodes
        saved as the next step's trajectories) and trains on the episodes it kept."""
        rounds = self.config.from_rollouts.rounds if self.config.from_rollouts.enabled else 0
        for phase in range(1, rounds + 1):
            if step >= self.total:
                break
            result, kept, rollout_metrics = await rejection_sample(self.config, self.model, self.renderer, phase)
            trajectories = result.trajectories
            self.logbook.save_trajectories(
                step + 1, trajectories, [t.total_reward for t in trajectories], [None] * len(trajectories)
            )
            if self.logbook.console:
                mean = rollout_metrics.get("rollout/mean_total_reward")
                print(
                    f"sft round {phase}: kept {len(kept)} of {rollout_metrics['rollout/episodes']} episodes "
                    f"(mean reward {'n/a' if mean is None else f'{mean:.3f}'})",
                    file=sys.stderr,
                    flush=True,
                )
            if kept:
                examples = [e for t in kept for e in trajectory_examples(t, self.renderer.images)]
                step = self.train(examples, phase=phase, step=step, extra=rollout_metrics)
        return step

    def checkpoint(self, step: int) -> None:
        """The model, tokenizer (a vision-language model's processor, with its image settings),
        optimizer and schedule after ``step``, under ``out/checkpoints``."""
        config, images = self.config, self.renderer.images
        ckpt.save_checkpoint(
            Path(config.out) / "checkpoints",
            step,
            TrainedPolicy(self.model, self.optimizer, self.scheduler),
            self.tokenizer if images is None else images.processor,
            {"step": step},
            config.keep_checkpoints,
        )
