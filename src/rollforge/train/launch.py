"""Where a training run runs: ``atrain`` (the run, in this process) and ``train`` (its synchronous
façade, which may start the ranks on Ray instead).

``atrain`` sets the run up (``run.open_run``), evaluates before training, runs the synchronous loop
(``loop.py``) or, with ``algorithm.max_staleness`` >= 1, the asynchronous pipeline
(``pipeline.py``), evaluates after, and returns a ``TrainResult``.

``train`` runs ``train_rank`` here: one process, or one of torchrun's ranks. With ``executor: ray``
and ``ray.training_workers`` > 1 it hands ``cluster/trainers.py`` the entry point ``train_rank``
instead, which each Ray actor calls as one rank. ``cluster/`` never imports ``train/``: it runs the
entry it is handed, so a rank cannot start ranks again and nothing has to guard against it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..backends.base import Backend
from ..cluster.trainers import train_on_ray
from ..envs.base import GeneratingEnvironment
from ..errors import ConfigError
from ..workers import run_sync
from .config import TrainConfig
from .environments import build_environments, named_environments
from .logbook import read_metrics
from .loop import train_sync
from .pipeline import train_async
from .rewards import RewardFunction
from .run import evaluate, open_run


@dataclass(frozen=True)
class TrainResult:
    out: Path
    steps: int  # last step completed
    history: list[dict[str, Any]]
    evaluations: dict[str, Any]  # "before"/"after": held-out greedy EvalResult.to_json()


def train(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """Synchronous façade over ``atrain``; with ``executor: ray`` and ``ray.training_workers`` > 1,
    the ranks run on Ray actors (``cluster/trainers.py``) and this returns rank 0's result."""
    if config.executor == "ray" and config.ray.training_workers > 1 and not _started_by_torchrun():
        pooled = _pooled_environments(config, kwargs.get("environments"))
        return train_on_ray(train_rank, config, kwargs, pooled_environments=pooled)
    return train_rank(config, **kwargs)


def train_rank(config: TrainConfig, **kwargs: Any) -> TrainResult:
    """One rank's run (the only one, one of torchrun's, or a Ray actor's): ``atrain`` on rollforge's
    event loop."""
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
        if run.eval_prompts and run.start == 0:
            await evaluate(run, "before", run.start)
        loop = train_async if config.algorithm.max_staleness else train_sync
        step = await loop(run, on_step)
        if run.eval_prompts and step == config.steps:
            await evaluate(run, "after", step)
        return TrainResult(run.out, step, read_metrics(run.out / "metrics.jsonl"), run.evaluations)


def _started_by_torchrun() -> bool:
    """Whether torchrun started this process as one of several ranks (``WORLD_SIZE`` > 1): it
    trains here, where ``inputs.check_ranks`` refuses Ray training workers on top (one launcher, not
    both). A ``WORLD_SIZE`` of 1 (a job scheduler's, another library's) is a process alone."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.strip().isdigit():
        raise ConfigError(f"WORLD_SIZE={world!r} in the environment: expected a whole number of ranks (torchrun sets it)")
    return int(world) > 1


def _pooled_environments(config: TrainConfig, environments: Any) -> int:
    """How many environments each rank puts in actor pools (``executor.environments_on_ray``): the
    config's and those given to ``train()``, built here as each rank builds them, less the agent
    programs that stay on the driver. An unknown environment is refused here, before anything starts."""
    given = named_environments(environments) if environments is not None else {}
    configured = config.environments if not given or "environments" in config.model_fields_set else []
    built = build_environments(configured, given)
    return len({id(env) for env in built.values() if not isinstance(env, GeneratingEnvironment)})
