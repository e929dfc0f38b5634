"""What ``open_run`` checks before a run starts, so that a refusal is quick: the ranks'
constraints (``check_ranks``), and, before the model loads, ``rollout.max_seq_len`` against the
model's positions (read from its ``config.json``: more is refused in one line naming both), the
prompts (``rollout.checks.check_prompts``: their tasks and routes, their lengths with their
environments' tools, the chat template), the server and the run directory (``preflight``); and the
run's ``config.yaml`` (``write_config``, SFT's too). What the run reads (environments, prompts) is
read in ``inputs/``.

The prompts are checked here once, with the renderer the run generates with: the ``CheckedPrompts``
that ``preflight`` returns lets every step's rollout skip what it covers (``CheckedPrompts.batch``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..chat.render import ChatRenderer
from ..envs.base import Environment
from ..errors import ConfigError
from ..files import atomic_write
from ..models import load_tokenizer
from ..rollout.checks import CheckedBatch, CheckedPrompts, check_prompts, fit_max_seq_len, model_positions
from ..types import Sample
from . import checkpoint as ckpt
from .config import TrainConfig
from .distributed import Ranks


def check_ranks(config: TrainConfig, ranks: Ranks) -> None:
    if not ranks.distributed:
        return
    if config.algorithm.max_staleness:
        raise ConfigError(
            f"algorithm.max_staleness={config.algorithm.max_staleness} with {ranks.world} ranks is not supported "
            "yet: train asynchronously on one rank, or set max_staleness=0"
        )
    if config.algorithm.dynamic_sampling:
        raise ConfigError(
            f"algorithm.dynamic_sampling with {ranks.world} ranks is not supported yet: "
            "train on one rank or set dynamic_sampling false"
        )
    ranks.groups_per_rank(config.algorithm.batch_size)  # before the model loads
    if config.ray.training_workers > 1 and config.executor == "ray" and "RAY_TRAINING_RANK" not in os.environ:
        raise ConfigError(
            f"ray.training_workers={config.ray.training_workers} under torchrun: start the ranks with torchrun or "
            f"with Ray, not both"
        )
    if config.lora.enabled:
        raise ConfigError(f"lora.enabled with {ranks.world} ranks is not supported yet: train LoRA on one rank")
    if config.executor == "ray" and config.ray.generation_replicas > 1:
        raise ConfigError(
            f"ray.generation_replicas={config.ray.generation_replicas} under torchrun would start replicas on "
            f"every rank: serve the model with `vllm serve` and set model.backend=openai, or train on one rank"
        )


@dataclass(frozen=True)
class Preflight:
    """What ``preflight`` found: the checkpoint to resume from (None: a fresh run), the run's
    prompts as checked, and its held-out prompts as a batch of checked ones (empty: none)."""

    resumed: ckpt.Loaded | None
    checked: CheckedPrompts
    held_out: CheckedBatch | tuple[()] = ()


def preflight(
    config: TrainConfig,
    prompts: list[Sample],
    resume: bool,
    overwrite: bool,
    renderer: ChatRenderer | None = None,
    task_to_env: Mapping[str, Environment] | None = None,
    held_out: Sequence[Sample] = (),
) -> Preflight:
    """What can refuse the run, checked before the model loads so that a refusal is quick: a
    ``rollout.max_seq_len`` over the model's positions, prompts that ``check_prompts`` refuses
    (routed to ``task_to_env``, rendered with ``renderer``: the run's, else one of the model's
    tokenizer), the ``held_out`` prompts the same way, an OpenAI-compatible server that does not answer, and the run directory: with
    ``resume`` the checkpoint to continue from, else one that holds no run yet (``overwrite``:
    deleting the one it holds)."""
    renderer = renderer if renderer is not None else ChatRenderer(load_tokenizer(config.model.name))
    positions = model_positions(config.model.name)
    fit_max_seq_len(config.rollout.max_seq_len, positions, "rollout.max_seq_len", 0)
    envs = task_to_env if task_to_env is not None else {}
    checked = check_prompts(prompts, envs, renderer, config.rollout, "rollout.max_seq_len", positions)
    evaluated = (
        check_prompts(held_out, envs, renderer, config.rollout, "rollout.max_seq_len", positions) if held_out else None
    )
    held = evaluated.batch(held_out) if evaluated else ()
    if config.model.backend == "openai" and config.model.base_url:
        from ..backends.openai_compat import check_server
        from ..backends.opening import server_urls

        for url in server_urls(config.model.base_url):
            check_server(url)
    if resume and overwrite:
        raise ConfigError(
            "resume and overwrite exclude each other: continue the run in out, or delete it and start over"
        )
    if resume:
        return Preflight(ckpt.resumable(Path(config.out)), checked, held)
    ckpt.start_fresh(Path(config.out), overwrite)
    return Preflight(None, checked, held)


def write_config(out: Path, config: Any) -> None:
    """The run's ``config.yaml``: the config as it ran, every default filled in."""
    atomic_write(out / "config.yaml", yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
