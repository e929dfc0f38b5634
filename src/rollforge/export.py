"""Trajectories as a Hugging Face ``datasets.Dataset``, in one call.

``to_dataset(source)`` takes ``Trajectory`` objects, trajectory records (the dicts of
``trajectories.jsonl``), or a path / glob of such files (a rollout's ``trajectories.jsonl``, a
training run's ``trajectories/step-*.jsonl``; a rollout directory that an interruption left with
only ``trajectories.jsonl.partial``: the episodes it wrote). One row per episode, with a fixed schema so that
rows of different environments concatenate:

- ``index``, ``task_name``, ``step`` (training runs: the step of the file, else null);
- ``messages``: ``[{role, content, name, tool_calls: [{name, arguments, id, error}]}]``, the
  arguments as a JSON string (the OpenAI wire form: argument shapes differ between tools);
- ``token_ids``, ``loss_mask``, ``logprobs`` (null off the mask), ``prompt_length``: exactly as rolled out;
- ``rewards`` (per turn), ``total_reward``, ``reward`` and ``advantage`` (training runs, else null);
- ``turns``, ``terminated``, ``truncated``, ``max_turns_reached``, ``error_kind``, ``error_message``,
  ``failures`` (the kinds, in order), ``metadata`` and ``tools`` as JSON strings.

Images in messages are not exported (their bytes belong in an image column of their own).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import ConfigError, require
from .types import Trajectory

_STEP = re.compile(r"step-(\d+)\.jsonl$")


def to_dataset(source: Iterable[Trajectory | Mapping[str, Any]] | str | Path):
    """A ``datasets.Dataset`` with one row per episode (see the module docstring)."""
    datasets = require("datasets", extra="train", feature="exporting trajectories to a dataset")
    rows = [to_row(record, step) for record, step in _records(source)]
    if not rows:
        raise ConfigError(f"no trajectories to export from {source!r:.120}")
    return datasets.Dataset.from_list(rows, features=_features(datasets))


def to_row(record: Trajectory | Mapping[str, Any], step: int | None = None) -> dict[str, Any]:
    """One episode as a dataset row."""
    if isinstance(record, Trajectory):
        record = record.to_json()
    error = record.get("error") or {}
    return {
        "index": int(record.get("index", 0)),
        "task_name": record.get("task_name", "default"),
        "step": step,
        "messages": [_message(m) for m in record.get("messages", [])],
        "token_ids": list(record["token_ids"]),
        "loss_mask": list(record["loss_mask"]),
        "logprobs": list(record["logprobs"]),
        "prompt_length": int(record.get("prompt_length", 0)),
        "rewards": [float(r) for r in record.get("rewards", [])],
        "total_reward": float(record.get("total_reward", 0.0)),
        "reward": _float(record.get("reward")),
        "advantage": _float(record.get("advantage")),
        "turns": int(record.get("turns", 0)),
        "terminated": bool(record.get("terminated", False)),
        "truncated": bool(record.get("truncated", False)),
        "max_turns_reached": bool(record.get("max_turns_reached", False)),
        "error_kind": error.get("kind"),
        "error_message": error.get("message"),
        "failures": [f["kind"] for f in record.get("failures", [])],
        "metadata": json.dumps(record.get("metadata")),
        "tools": json.dumps(record.get("tools", [])),
    }


def _message(m: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "role": m["role"],
        "content": m["content"],
        "name": m.get("name"),
        "tool_calls": [
            {
                "name": c["name"],
                "arguments": json.dumps(c.get("arguments", {})),
                "id": c.get("id"),
                "error": c.get("error"),
            }
            for c in m.get("tool_calls", [])
        ],
    }


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _records(source) -> Iterable[tuple[Any, int | None]]:
    if isinstance(source, (str, Path)):
        from .recipes.sft_data import read_records

        pattern = Path(source)
        if pattern.is_dir():  # a run directory
            pattern = _run_file(pattern)
        files = sorted(pattern.parent.glob(pattern.name)) if "*" in pattern.name else [pattern]
        for file in files:
            step = _STEP.search(file.name)
            for record in read_records(file):
                yield record, int(step.group(1)) if step else None
        return
    for record in source:
        yield record, None


def _run_file(run: Path) -> Path:
    """The trajectories of a run directory: a rollout's ``trajectories.jsonl``, else the episodes an
    interrupted rollout wrote (``trajectories.jsonl.partial``), else a training run's step files."""
    for name in ("trajectories.jsonl", "trajectories.jsonl.partial"):
        if (run / name).is_file():
            return run / name
    return run / "trajectories" / "step-*.jsonl"


def _features(datasets):
    v = datasets.Value
    call = {"name": v("string"), "arguments": v("string"), "id": v("string"), "error": v("string")}
    message = {"role": v("string"), "content": v("string"), "name": v("string"), "tool_calls": datasets.List(call)}
    return datasets.Features(
        {
            "index": v("int64"),
            "task_name": v("string"),
            "step": v("int64"),
            "messages": datasets.List(message),
            "token_ids": datasets.List(v("int64")),
            "loss_mask": datasets.List(v("int8")),
            "logprobs": datasets.List(v("float64")),
            "prompt_length": v("int64"),
            "rewards": datasets.List(v("float64")),
            "total_reward": v("float64"),
            "reward": v("float64"),
            "advantage": v("float64"),
            "turns": v("int64"),
            "terminated": v("bool"),
            "truncated": v("bool"),
            "max_turns_reached": v("bool"),
            "error_kind": v("string"),
            "error_message": v("string"),
            "failures": datasets.List(v("string")),
            "metadata": v("string"),
            "tools": v("string"),
        }
    )
