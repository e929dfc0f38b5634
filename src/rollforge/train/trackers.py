"""The experiment trackers a training run reports to (``report_to``): TensorBoard, Weights & Biases,
trackio and MLflow, several at once, each behind one small protocol (``Tracker``): the config once
at start-up, each step's scalar metrics, each step's table of sampled completions, and ``close``.

``metrics.jsonl`` stays the run's record; a tracker is a copy for the dashboard its user already
watches. So a tracker may fail without costing the run: ``Trackers`` sends every call to each
tracker still working, and one that raises is reported once on stderr and dropped for the rest of
the run (not closed: a tracker that failed may hang in its own shutdown). At start-up, before the
model loads, failures are loud instead: a package that is not installed is ``MissingDependency``
naming the extra (checked for every tracker before any run is started), and a tracker that cannot
start its run (no login, a tracking server that does not answer) is a one-line ``ConfigError``.

Each tracker imports its package in its own constructor, so naming none costs no import. The run
is named after the run directory; the project (MLflow: experiment) is ``rollforge`` unless
``WANDB_PROJECT``, ``TRACKIO_PROJECT`` or ``MLFLOW_EXPERIMENT_NAME`` names another. Everything else
(``WANDB_MODE``, ``WANDB_DIR``, ``TRACKIO_DIR``, ``MLFLOW_TRACKING_URI``) is the package's own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Protocol, Sequence

from ..errors import ConfigError, MissingDependency, require
from ..types import Message, Trajectory

TrackerName = Literal["tensorboard", "wandb", "trackio", "mlflow"]
COMPLETIONS_PER_STEP = 4  # rows of a step's completions table, spread over the batch's groups
COLUMNS = ("step", "task", "prompt", "completion", "reward", "advantage")


@dataclass(frozen=True)
class CompletionRow:
    """One sampled episode of a step, as the completions table shows it."""

    step: int
    task: str
    prompt: str  # the prompt's messages after any system message
    completion: str  # every message after the prompt: the policy's turns and what tools answered
    reward: float | None
    advantage: float | None

    def values(self) -> list[Any]:
        return [getattr(self, column) for column in COLUMNS]


@dataclass(frozen=True)
class RunInfo:
    """What every tracker names its run after."""

    out: Path  # the run directory
    name: str  # the run's name in the tracker

    def project(self, variable: str) -> str:
        """The project (MLflow: experiment) the environment ``variable`` names, else ``rollforge``."""
        return os.environ.get(variable) or "rollforge"


class Tracker(Protocol):
    """One dashboard a run reports to."""

    name: str

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_completions(self, step: int, rows: Sequence[CompletionRow]) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """``out/tensorboard``: scalars, the config and each step's completions as text. The folder
    appears with the first thing written (a run stopped before that leaves none)."""

    name, packages, extra = "tensorboard", ("tensorboard",), "tensorboard"

    def __init__(self, run: RunInfo):
        self._board = require("torch.utils.tensorboard", self.extra, "report_to: tensorboard")
        self._folder, self._writer = run.out / "tensorboard", None

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._opened().add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        writer = self._opened()
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
        writer.flush()

    def log_completions(self, step: int, rows: Sequence[CompletionRow]) -> None:
        lines = ["|" + "|".join(COLUMNS) + "|", "|" + "---|" * len(COLUMNS)]
        lines += ["|" + "|".join(_markdown_cell(v) for v in row.values()) + "|" for row in rows]
        self._opened().add_text("completions", "\n".join(lines), step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def _opened(self):
        if self._writer is None:
            self._writer = self._board.SummaryWriter(str(self._folder))
        return self._writer


class WandbTracker:
    """A Weights & Biases run, its files under the run directory unless ``WANDB_DIR`` says where."""

    name, packages, extra = "wandb", ("wandb",), "wandb"

    def __init__(self, run: RunInfo):
        self._wandb = require("wandb", self.extra, "report_to: wandb")
        where = os.environ.get("WANDB_DIR") or str(run.out)  # read here: wandb reads it once a process
        self._run = self._wandb.init(project=run.project("WANDB_PROJECT"), name=run.name, dir=where)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def log_completions(self, step: int, rows: Sequence[CompletionRow]) -> None:
        table = self._wandb.Table(columns=list(COLUMNS), data=[row.values() for row in rows])
        self._run.log({"completions": table}, step=step)

    def close(self) -> None:
        self._run.finish()


class TrackioTracker:
    """A trackio run in its local store (``TRACKIO_DIR``) or wherever trackio's settings send it.
    trackio takes a run's config only as the run starts, so the run starts at ``log_config`` (or
    at the first log without one). trackio's own messages go to stderr: stdout stays the command's."""

    name, packages, extra = "trackio", ("trackio",), "trackio"

    def __init__(self, run: RunInfo):
        self._trackio = require("trackio", self.extra, "report_to: trackio")
        self._info, self._run = run, None

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._started(config)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._started().log(dict(metrics), step=step)

    def log_completions(self, step: int, rows: Sequence[CompletionRow]) -> None:
        table = self._trackio.Table(columns=list(COLUMNS), data=[row.values() for row in rows])
        self._started().log({"completions": table}, step=step)

    def close(self) -> None:
        if self._run is not None:
            with contextlib.redirect_stdout(sys.stderr):
                self._run.finish()

    def _started(self, config: Mapping[str, Any] | None = None):
        if self._run is None:
            with contextlib.redirect_stdout(sys.stderr):
                self._run = self._trackio.init(
                    project=self._info.project("TRACKIO_PROJECT"),
                    name=self._info.name,
                    config=None if config is None else dict(config),
                )
        return self._run


class MLflowTracker:
    """An MLflow run (``MLFLOW_TRACKING_URI``): metrics, the config flattened into params and whole
    as ``config.json``, each step's completions as ``completions/step-NNNNNN.json``. Through a
    client, not MLflow's global active run, which stays the user's."""

    name, packages, extra = "mlflow", ("mlflow", "pandas"), "mlflow"  # pandas: what log_table writes with
    MAX_PARAMS, MAX_VALUE = 100, 6000  # per log_batch call; characters of one param value

    def __init__(self, run: RunInfo):
        self._entities = require("mlflow.entities", self.extra, "report_to: mlflow")
        self._client = require("mlflow", self.extra, "report_to: mlflow").MlflowClient()
        experiment = run.project("MLFLOW_EXPERIMENT_NAME")
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else self._client.create_experiment(experiment)
        self._id = self._client.create_run(experiment_id, run_name=run.name).info.run_id

    def log_config(self, config: Mapping[str, Any]) -> None:
        params = [self._entities.Param(key, str(value)[: self.MAX_VALUE]) for key, value in _flat(config).items()]
        for first in range(0, len(params), self.MAX_PARAMS):
            self._client.log_batch(self._id, params=params[first : first + self.MAX_PARAMS])
        self._client.log_dict(self._id, dict(config), "config.json")

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._entities.Metric(_mlflow_key(key), value, now, step) for key, value in metrics.items()]
        self._client.log_batch(self._id, metrics=batch)

    def log_completions(self, step: int, rows: Sequence[CompletionRow]) -> None:
        table = {column: [getattr(row, column) for row in rows] for column in COLUMNS}
        self._client.log_table(self._id, table, f"completions/step-{step:06d}.json")

    def close(self) -> None:
        self._client.set_terminated(self._id)


TRACKERS: dict[str, type] = {t.name: t for t in (TensorBoardTracker, WandbTracker, TrackioTracker, MLflowTracker)}


class Trackers:
    """The trackers a run reports to, as one: each call goes to every tracker still working; one
    that raises is reported once on stderr and dropped (see the module docstring)."""

    def __init__(self, trackers: Sequence[Tracker] = ()):
        self._live = list(trackers)

    @property
    def names(self) -> tuple[str, ...]:
        """The trackers still working."""
        return tuple(tracker.name for tracker in self._live)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._each(f"step {step}'s metrics", lambda tracker: tracker.log_metrics(step, metrics))

    def log_completions(self, step: int, rows: Sequence[CompletionRow]) -> None:
        self._each(f"step {step}'s completions", lambda tracker: tracker.log_completions(step, rows))

    def close(self) -> None:
        self._each("closing", lambda tracker: tracker.close())
        self._live = []

    def _each(self, what: str, call) -> None:
        for tracker in list(self._live):
            try:
                call(tracker)
            except Exception as error:  # a dashboard's failure is not the run's: metrics.jsonl has it all
                self._live.remove(tracker)
                print(
                    f"rollforge: report_to {tracker.name} failed on {what} ({_one_line(error)}); "
                    f"{tracker.name} gets nothing more from this run",
                    file=sys.stderr,
                    flush=True,
                )


def open_trackers(report_to: Sequence[str] | None, out: Path, config: Mapping[str, Any] | None = None) -> Trackers:
    """The trackers ``report_to`` names, each with its run started and ``config`` logged (when
    given). None: TensorBoard when it is installed, else none. An unknown name is a ``ConfigError``
    and a missing package ``MissingDependency``, before any run starts; a tracker that cannot start
    is a ``ConfigError`` (the trackers already started are closed)."""
    if report_to is None:
        report_to = ["tensorboard"] if importlib.util.find_spec("tensorboard") is not None else []
    if unknown := [name for name in report_to if name not in TRACKERS]:
        raise ConfigError(f"report_to: unknown tracker {unknown[0]!r}; expected some of {', '.join(TRACKERS)}")
    kinds = [TRACKERS[name] for name in report_to]
    for kind in kinds:
        for package in kind.packages:
            if importlib.util.find_spec(package) is None:
                raise MissingDependency(package, kind.extra, f"report_to: {kind.name}")
    run, started = RunInfo(out, out.resolve().name), []
    with contextlib.ExitStack() as undo:
        undo.callback(lambda: Trackers(started).close())
        for kind in kinds:
            started.append(_start(kind, run, config))
        undo.pop_all()
    return Trackers(started)


def _start(kind: type, run: RunInfo, config: Mapping[str, Any] | None) -> Tracker:
    """A tracker with its run started and the config logged; a failure is one line."""
    tracker = None
    try:
        tracker = kind(run)
        if config is not None:
            tracker.log_config(config)
        return tracker
    except MissingDependency:
        raise
    except Exception as error:
        if tracker is not None:
            with contextlib.suppress(Exception):  # the start failed already; that is the error to show
                tracker.close()
        raise ConfigError(f"report_to: {kind.name} could not start its run: {_one_line(error)}") from error


def completion_rows(
    step: int,
    trajectories: Sequence[Trajectory],
    rewards: Sequence[float],
    advantages: Sequence[float],
    count: int = COMPLETIONS_PER_STEP,
) -> list[CompletionRow]:
    """``count`` episodes of a step, evenly spaced over the batch (a group's episodes are adjacent,
    so they come from different groups while there are as many groups)."""
    total = len(trajectories)
    picked = [i * total // count for i in range(min(count, total))]
    return [_row(step, trajectories[i], rewards[i], advantages[i]) for i in picked]


def _row(step: int, trajectory: Trajectory, reward: float | None, advantage: float | None) -> CompletionRow:
    messages = trajectory.messages
    split = trajectory.prompt_messages
    if split is None:  # not recorded: the prompt ends where the policy first speaks
        split = next((i for i, m in enumerate(messages) if m.role == "assistant"), len(messages))
    prompt = [m for m in messages[:split] if m.role != "system"]
    return CompletionRow(
        step, trajectory.task_name, _text(prompt), _text(messages[split:]), _number(reward), _number(advantage)
    )


def _text(messages: Sequence[Message]) -> str:
    return "\n\n".join(f"[{m.role}] {m.content}" for m in messages)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-5}}`` as ``{"optim.lr": 1e-5}``; lists as JSON text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


def _markdown_cell(value: Any) -> str:
    """``value`` inside a markdown table's cell: its bars escaped, its lines broken with ``<br>``."""
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def _mlflow_key(key: str) -> str:
    """MLflow's metric names allow letters, digits, ``_-. /`` only."""
    return re.sub(r"[^\w\-. /]", "_", key)


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"
