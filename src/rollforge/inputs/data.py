"""Prompts: where they come from, and the seeded order in which a training run draws them.

Sources (``read.py`` picks one and reads it once): a file (``.jsonl``, ``.json``, ``.parquet``) or
a saved ``datasets`` directory, an in-memory ``datasets.Dataset`` or list of dicts, or, without
either, the bundled environments' own sample generators, sharing their count by weight
(``weighted_counts``) or evenly (``even_counts``), interleaved in proportion (weights 2:1:1 give
each run of four prompts two of the first and one of each other). A row's ``prompt`` is text (one
user message, after the optional system prompt) or a list of ``{role, content}`` messages; ``task_name`` routes
it (default: the only environment, else its ``environment`` column when that names a configured
task); every other column reaches ``reset(**row)`` and the reward functions.
A NeMo Gym dataset row has no ``prompt``: its prompt is read from its ``responses_create_params``
(``envs/adapters/nemo_gym_wire.py``).

``PromptSource`` walks a fresh seeded permutation per epoch. Its state is (epoch, cursor): saving
and restoring it in a checkpoint makes a resumed run draw exactly the prompts the uninterrupted run
would have, none twice and none skipped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..envs.adapters import nemo_gym_wire
from ..envs.library import get_env_spec
from ..errors import ConfigError, InvariantError
from ..rollout.checks import check_prompt_lengths  # noqa: F401  (re-exported: the CLI and training call it early)
from ..types import Message, Sample
from .config import EnvConfig


class PromptSource:
    def __init__(self, samples: Sequence[Sample], seed: int = 0, shuffle: bool = True):
        if not samples:
            raise ConfigError("the prompt source is empty: expected at least one prompt")
        self.samples = list(samples)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Sample]:
        out = []
        for _ in range(n):
            if self.cursor == len(self._order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.samples[self._order[self.cursor]])
            self.cursor += 1
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "size": len(self.samples)}

    def load_state(self, state: Mapping[str, int]) -> None:
        if state.get("size") != len(self.samples):
            raise ConfigError(
                f"the checkpoint was taken with {state.get('size')} prompts but the data now has "
                f"{len(self.samples)}; resume with the same data"
            )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation(self.epoch)


def check_generators(envs: Sequence[EnvConfig], env_flag: str = "environment", data_flag: str = "data.path") -> None:
    """Every environment is bundled, so has a prompt generator (the flags name the settings)."""
    from .environments import is_bundled

    for env in envs:
        if not is_bundled(env.name):
            raise ConfigError(f"{env_flag} {env.name!r} has no prompt generator; give prompts with {data_flag}")


def weighted_counts(envs: Sequence[EnvConfig], size: int) -> list[int]:
    """Each environment's share of ``size`` by weight, at least one (training)."""
    total = sum(e.weight for e in envs)
    return [max(1, round(size * e.weight / total)) for e in envs]


def even_counts(envs: Sequence[EnvConfig], size: int) -> list[int]:
    """``size`` split evenly, the first environments getting the remainder (``rollforge rollout``)."""
    k = len(envs)
    return [size // k + (i < size % k) for i in range(k)]


def generated_samples(
    envs: Sequence[EnvConfig],
    size: int,
    seed: int,
    counts: Callable[[Sequence[EnvConfig], int], list[int]] = weighted_counts,
) -> list[Sample]:
    """``size`` prompts from bundled environments' generators, shared by ``counts``, interleaved in
    proportion: the ``j``-th of ``n`` prompts of a generator sits at ``(j + 1/2) / n`` of the way,
    ties in the environments' order (equal counts: one of each in turn)."""
    check_generators(envs)
    shares = counts(envs, size)
    groups = []
    for i, (env, count) in enumerate(zip(envs, shares)):
        try:
            samples = get_env_spec(env.name).samples(count, seed + i, **env.options)
        except TypeError as exc:
            raise ConfigError(f"bad options {env.options} for environment {env.name!r}: {exc}") from None
        if env.task_name:
            samples = [Sample(s.prompt, env.task_name, s.row, s.stop) for s in samples]
        groups.append(samples)
    placed = [((j + 0.5) / len(g), i, j) for i, g in enumerate(groups) for j in range(len(g))]
    return [groups[i][j] for _, i, j in sorted(placed)]


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"data.path {str(path)!r} does not exist")
    if path.is_dir():
        return _datasets_rows(path)
    try:
        text = path.read_text() if path.suffix in (".jsonl", ".json") else ""
    except UnicodeDecodeError as exc:
        raise ConfigError(f"data file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if path.suffix == ".jsonl":
        return [_row(_json(line, path, n), path, n) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    if path.suffix == ".json":
        data = _json(text, path, None)
        if not isinstance(data, list):
            raise ConfigError(f"{str(path)!r} must hold a JSON list of rows, got {type(data).__name__}")
        return [_row(r, path, n) for n, r in enumerate(data, 1)]
    if path.suffix == ".parquet":
        from ..errors import require

        pq = require("pyarrow.parquet", extra="train", feature="parquet prompt files")
        return pq.read_table(path).to_pylist()
    raise ConfigError(f"data.path {str(path)!r}: expected .jsonl, .json, .parquet or a saved datasets directory")


def _datasets_rows(path: Path) -> list[dict[str, Any]]:
    from ..errors import require

    datasets = require("datasets", extra="train", feature="saved datasets directories")
    return list(datasets.load_from_disk(str(path)))


def _json(text: str, path: Path, line: int | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {line}" if line is not None else f"line {exc.lineno}"
        raise ConfigError(f"{str(path)!r} {where} is not valid JSON: {exc.msg} (column {exc.colno})") from None


def _row(row: Any, path: Path, line: int) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ConfigError(f"{str(path)!r} row {line}: expected an object, got {type(row).__name__}")
    return row


def rows_to_samples(
    rows: Iterable[Mapping[str, Any]], tasks: Sequence[str], system_prompt: str | None = None
) -> list[Sample]:
    out = []
    for n, row in enumerate(rows, 1):
        if "prompt" not in row and nemo_gym_wire.PARAMS in row:  # a NeMo Gym dataset row, unchanged
            prompt = nemo_gym_wire.prompt_of(row)
        elif "prompt" not in row:
            raise ConfigError(f"prompt row {n} has no 'prompt' column (columns: {sorted(row)})")
        else:
            prompt = _messages(row["prompt"], system_prompt, n)
        task = row.get("task_name") or (row.get("environment") if row.get("environment") in tasks else None)
        if task is None:
            if len(tasks) != 1:
                raise ConfigError(
                    f"prompt row {n} has no task_name column and there are several environments {list(tasks)}"
                )
            task = tasks[0]
        if task not in tasks:
            raise ConfigError(f"prompt row {n}: task_name {task!r} is not a configured environment {list(tasks)}")
        columns = {k: v for k, v in row.items() if k not in ("prompt", "task_name")}
        out.append(Sample(prompt=prompt, task_name=task, row=columns))
    return out


def _messages(prompt: Any, system_prompt: str | None, n: int) -> tuple[Message, ...]:
    if isinstance(prompt, str):
        head = (Message("system", system_prompt),) if system_prompt else ()
        return (*head, Message("user", prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(m, Mapping) for m in prompt):
        try:
            return tuple(Message(m["role"], m["content"]) for m in prompt)
        except (KeyError, TypeError, InvariantError) as exc:
            raise ConfigError(f"prompt row {n}: bad message list ({exc})") from None
    raise ConfigError(
        f"prompt row {n}: 'prompt' must be text or a list of {{role, content}} messages, got {prompt!r:.80}"
    )
