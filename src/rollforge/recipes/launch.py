"""Where a training run runs: ``atrain`` (the run, in this process) and ``train`` (its synchronous
façade, which may start the ranks on Ray instead).

``atrain`` sets the run up (``train/run_setup.py``: ``open_run``), evaluates before training, runs the
synchronous loop (``grpo.py``) or, with ``algorithm.max_staleness`` >= 1, the asynchronous pipeline
(``grpo_async.py``), evaluates after, and returns a ``TrainResult``.

``train`` runs ``train_rank`` here: one process, or one of torchrun's ranks. With ``executor: ray``
and ``ray.training_workers`` > 1 it hands ``cluster/trainers.py`` the entry point ``train_rank``
instead, which each Ray actor calls as one rank. ``cluster/`` never imports the recipes: it runs the
entry it is handed, so a rank cannot start ranks again and nothing has to guard against it.
When a Ray worker is lost, ``cluster/`` reads where the run stopped through ``where_it_stopped``
(the last step ``metrics.jsonl`` records and the checkpoint ``--resume`` continues from), which the
CLI's interruption line shares (``where_to_continue``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from typing_extensions import Unpack

from ..cluster.trainers import train_on_ray
from ..envs.base import GeneratingEnvironment
from ..errors import ConfigError
from ..inputs.read import read_inputs, training_prompts
from ..train import checkpoint as ckpt
from ..train.config import TrainConfig
from ..train.config_files import check_unchanged
from ..train.logbook import read_metrics
from ..train.run import evaluate
from ..train.run_setup import TrainOptions, check_options, given_environments, open_run
from ..workers import run_sync
from .grpo import train_sync
from .grpo_async import train_async


@dataclass(frozen=True)
class TrainResult:
    out: Path
    steps: int  # last step completed
    history: list[dict[str, Any]]
    evaluations: dict[str, Any]  # "before"/"after": held-out greedy EvalResult.to_json()


def train(config: TrainConfig, **options: Unpack[TrainOptions]) -> TrainResult:
    """Train per ``config`` (``atrain``, on rollforge's event loop); with ``executor: ray`` and
    ``ray.training_workers`` > 1, the ranks run on Ray actors (``cluster/trainers.py``) and this
    returns rank 0's result. ``options``: see ``TrainOptions``."""
    check_options(options, "train")
    if config.executor == "ray" and config.ray.training_workers > 1 and not started_by_torchrun():
        pooled = _pooled_environments(config, options.get("environments"), options.get("dataset"))
        stopped_at = functools.partial(where_it_stopped, Path(config.out))
        return train_on_ray(train_rank, config, dict(options), pooled_environments=pooled, stopped_at=stopped_at)
    return train_rank(config, **options)


def train_rank(config: TrainConfig, **options: Unpack[TrainOptions]) -> TrainResult:
    """One rank's run (the only one, one of torchrun's, or a Ray actor's): ``atrain`` on rollforge's
    event loop."""
    return run_sync(atrain(config, **options))


async def atrain(config: TrainConfig, **options: Unpack[TrainOptions]) -> TrainResult:
    """Train per ``config``, with the ``options`` that ``TrainOptions`` declares (environments,
    dataset, reward functions, resume or overwrite, console, an ``on_step`` hook, a backend of your
    own). Without ``resume``, an ``out`` that holds a run already is refused, or with ``overwrite``
    cleared."""
    check_options(options, "atrain")
    if options.get("resume") and (Path(config.out) / "checkpoints").is_dir():  # only steps etc. may change
        check_unchanged(Path(config.out), given_environments(config, options.get("environments"))[0])
    async with open_run(config, **options) as run:
        if run.eval_prompts and run.start == 0:
            await evaluate(run, "before", run.start)
        loop = train_async if config.algorithm.max_staleness else train_sync
        step = await loop(run, options.get("on_step"))
        if run.eval_prompts and step == config.steps:
            await evaluate(run, "after", step)
        return TrainResult(run.out, step, read_metrics(run.out / "metrics.jsonl"), run.evaluations)


def where_to_continue(out: Path) -> str:
    """What ``--resume`` continues from in the run directory ``out``: the step and the checkpoint,
    or why there is none."""
    latest = ckpt.latest_checkpoint(out / "checkpoints")
    if latest is not None:
        return f"--resume continues after step {ckpt.step_of(latest)} (checkpoint {str(latest)!r})"
    if ckpt.recorded(out) is not None:
        return "no checkpoint was written yet: start over with --overwrite"
    return "nothing was recorded: run it again"


def where_it_stopped(out: Path) -> str:
    """Where a run that stopped stands, read from its directory ``out``: the last step its metrics
    record, then ``where_to_continue``."""
    steps = [record.get("step", 0) for record in read_metrics(out / "metrics.jsonl")]
    reached = f"the run stopped after step {max(steps)}" if steps else "the run stopped before its first step ended"
    return f"{reached}; {where_to_continue(out)}"


def started_by_torchrun() -> bool:
    """Whether torchrun started this process as one of several ranks (``WORLD_SIZE`` > 1): it
    trains here, where ``preflight.check_ranks`` refuses Ray training workers on top (one launcher,
    not both). A ``WORLD_SIZE`` of 1 (a job scheduler's, another library's) is a process alone."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.strip().isdigit():
        raise ConfigError(
            f"WORLD_SIZE={world!r} in the environment: expected a whole number of ranks (torchrun sets it)"
        )
    return int(world) > 1


def _pooled_environments(config: TrainConfig, environments: Any, dataset: Sequence[dict[str, Any]] | None) -> int:
    """How many environments each rank puts in actor pools (``executor.environments_on_ray``): the
    config's and those given to ``train()``, read here as each rank reads them (``open_run``), less
    the agent programs that stay on the driver. An unknown environment, or prompts that route to
    none, is refused here, before anything starts."""
    config, given = given_environments(config, environments)
    built, _ = read_inputs(config.environments, training_prompts(config.data, config.seed, dataset), given)
    return len({id(env) for env in built.values() if not isinstance(env, GeneratingEnvironment)})
