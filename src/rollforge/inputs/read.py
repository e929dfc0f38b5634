"""Setup reads its inputs once: ``read_inputs`` turns the environments and the prompts a run is
given into the engine's ``task_to_env`` and the samples, for training (``open_run``, from the
``environments`` and ``data`` sections) and for ``rollforge rollout`` (from ``--env`` and
``--data``) alike.

The prompts (``Prompts``) come from one place, in this order: rows in memory
(``train(dataset=...)``), a data file (read after the environments are built), or, without either,
the bundled environments' own generators (each environment checked to have one before any is
built). Rows are used once each, or cycled through to a count (the command); the generators share
their count by weight (training) or evenly (the command). Every sample is checked against the
environments (``check_routes``) before anything runs. A training run's prompts follow its ``data``
section (``training_prompts``); its held-out prompts come from the same place (``held_out``):
another seed of the generators, or the first rows.

Every place that builds environments reads them here: ``open_run`` and ``train()``'s count of
pooled environments, the quickstart's base evaluation, SFT's rejection sampling, ``rollforge
rollout``, ``rollforge eval`` and the learning benchmark's held-out questions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..envs.base import Environment
from ..errors import ConfigError
from ..seeds import held_out_seed
from ..types import Sample
from .config import DataConfig, EnvConfig
from .data import check_generators, generated_samples, load_rows, rows_to_samples, weighted_counts
from .environments import build_environments, check_routes


@dataclass(frozen=True)
class Prompts:
    """Where a run's samples come from, and how its error messages name the settings."""

    rows: Sequence[Mapping[str, Any]] | None = None
    """Rows in memory; they win over ``path``."""
    path: str | Path | None = None
    """A data file (``data.path``, ``--data``); unset with ``rows``: the generators."""
    cycle: bool = False
    """Rows: refuse none, and cycle through them to ``count`` (``--data``)."""
    count: int | None = None
    """Rows, with ``cycle``: how many samples (None: each row once)."""
    generated: int = 16
    """How many samples the generators make."""
    limit: int | None = None
    """At most this many samples (held-out prompts: the first ones); None: all."""
    seed: int = 0
    system_prompt: str | None = None
    counts: Callable[[Sequence[EnvConfig], int], list[int]] = weighted_counts
    """How the generators share ``generated``."""
    env_flag: str = "environment"
    """How error messages name an environment setting, and the data setting."""
    data_flag: str = "data.path"


def read_inputs(
    environments: Sequence[EnvConfig],
    prompts: Prompts,
    given: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Environment], list[Sample]]:
    """The environments by task (the configured ones, then the ``given`` objects) and the samples."""
    if prompts.rows is None and prompts.path is None and not given:
        check_generators(environments, prompts.env_flag, prompts.data_flag)
    task_to_env = build_environments(list(environments), given)
    samples = read_samples(environments, prompts, list(task_to_env), given)
    check_routes(samples, task_to_env)
    return task_to_env, samples


def read_samples(
    environments: Sequence[EnvConfig],
    prompts: Prompts,
    tasks: list[str],
    given: Mapping[str, Any] | None = None,
) -> list[Sample]:
    """The samples alone, routed to ``tasks`` (the environments' task names)."""
    if prompts.rows is not None or prompts.path is not None:
        rows = prompts.rows if prompts.rows is not None else load_rows(prompts.path)
        samples = rows_to_samples(_cycled(rows, prompts), tasks, prompts.system_prompt)
    elif given:
        raise ConfigError(
            f"the environments given to train() ({', '.join(map(repr, given))}) have no prompt generator: "
            "pass dataset= or set data.path"
        )
    else:
        samples = generated_samples(environments, prompts.generated, prompts.seed, prompts.counts)
    return samples if prompts.limit is None else samples[: prompts.limit]


def training_prompts(data: DataConfig, seed: int, dataset: Sequence[Mapping[str, Any]] | None = None) -> Prompts:
    """Where a training run's prompts come from: ``dataset=``, else the ``data`` section."""
    return Prompts(rows=dataset, path=data.path, generated=data.size, seed=seed, system_prompt=data.system_prompt)


def held_out(prompts: Prompts, episodes: int) -> Prompts:
    """The held-out prompts beside ``prompts``: ``episodes`` from the generators under another seed,
    or the first ``episodes`` rows."""
    return replace(prompts, generated=episodes, seed=held_out_seed(prompts.seed), limit=episodes)


def _cycled(rows: Sequence[Mapping[str, Any]], prompts: Prompts) -> Sequence[Mapping[str, Any]]:
    if not prompts.cycle:
        return rows
    if not rows:
        raise ConfigError(f"{prompts.data_flag} {str(prompts.path)!r} holds no rows")
    return [rows[i % len(rows)] for i in range(prompts.count or len(rows))]
