"""Where ``rollforge rollout`` (and ``rollforge eval --out``) put their results, and how they are scored.

An output directory that holds a rollout already (``trajectories.jsonl``, its ``.partial`` or
``metrics.json``) is refused, as ``train``, ``sft`` and the quickstart refuse a used ``out``:
``--overwrite`` deletes those files first (``claim_out``). Nothing is deleted before every check
that can refuse the command has passed.

Each finished episode is appended to ``trajectories.jsonl.partial`` as it completes (nothing
produced is lost if the run dies); at the end the episodes are scored (``score``: the
environments' rewards plus the ``--reward`` functions, applied by training's own code,
``inputs/rewards.py``) and ``trajectories.jsonl`` is written in input order, each record with its
``reward`` when reward functions scored it, and ``metrics.json`` beside it (``mean_reward``: the
mean over the episodes whose reward is known; ``reward_functions``: each function's mean). A
rollout that nothing scores (``unscored``) reports its rewards as missing, never as zeros, and
says why in ``no_reward``.

``.partial`` never ends in a torn line: each record is one ``os.write`` of a whole line, and a
write that fails part-way (a full disk) is cut back to the last whole line. The first failing
write stops the rollout and raises its ``OSError`` (naming the file; ``cli/main.py`` answers it in
one line): ``.partial`` keeps the episodes written before it, and no ``trajectories.jsonl`` or
``metrics.json`` is left half-written. ``read_partial`` reads the whole lines back and ignores an
incomplete last one (a machine that lost power mid-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError
from ..files import atomic_write
from ..types import Sample, Trajectory

logger = logging.getLogger(__name__)

#: The files that show a directory holds a rollout (``rollforge eval --out`` writes two of them).
ROLLOUT_FILES = ("trajectories.jsonl", "trajectories.jsonl.partial", "metrics.json")


def check_out_dir(out: Path, flag: str) -> None:
    """An output directory, existing or not, but not a file."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {str(out)!r} is an existing file; expected a directory (existing or new)")


def claim_out(out: Path, overwrite: bool, flag: str = "--out") -> None:
    """Refuse ``out`` when it holds a rollout (see the module docstring); with ``overwrite``,
    delete that rollout's files instead."""
    check_out_dir(out, flag)
    found = [name for name in ROLLOUT_FILES if (out / name).exists()]
    if not found:
        return
    if not overwrite:
        raise ConfigError(
            f"{flag} {str(out)!r} already holds a rollout ({', '.join(found)}); start over with --overwrite "
            f"(deletes it) or give another {flag}"
        )
    for name in found:
        (out / name).unlink()
    logger.warning("deleted the rollout in %s (%s) to start over", out, ", ".join(found))


async def run_with_progress(
    samples: Sequence[Sample],
    task_to_env,
    backend,
    renderer,
    config,
    out: Path,
    functions: Sequence[Any] = (),
    no_reward: str | None = None,
):
    """Roll out with a progress bar, streaming episodes to ``.partial``, then score and write the
    results (``functions``: reward functions; ``no_reward``: why nothing scores the episodes, None
    when something may). The caller opened ``backend`` and closes it. Returns the result, its
    trajectories scored (``score``)."""
    from ..rollout.engine import RolloutResult

    out.mkdir(parents=True, exist_ok=True)
    partial = out / "trajectories.jsonl.partial"
    with PartialWriter(partial) as stream:
        result = await _stream(samples, task_to_env, backend, renderer, config, stream)
    trajectories, rewards, metrics = await score(result.trajectories, samples, result.metrics, functions, no_reward)
    write_results(out, trajectories, metrics, rewards if functions else None)
    partial.unlink()
    return RolloutResult(tuple(trajectories), metrics)


async def _stream(samples, task_to_env, backend, renderer, config, stream: PartialWriter):
    """The rollout, each episode appended to ``stream`` as it ends; the first failing write stops it."""
    from tqdm import tqdm

    from ..rollout.engine import arollout

    bar = tqdm(total=len(samples), desc="episodes", unit="ep")
    failed: list[OSError] = []  # the first failing write, which stops the rollout

    def on_episode(trajectory: Trajectory) -> None:
        bar.set_postfix(reward=f"{trajectory.total_reward:.2f}", refresh=False)
        bar.update()
        if failed:
            return
        try:
            stream.append(trajectory.to_json())
        except OSError as exc:
            failed.append(exc)
            rolling.cancel()

    rolling = asyncio.ensure_future(arollout(samples, task_to_env, backend, renderer, config, on_episode=on_episode))
    try:
        return await rolling
    except asyncio.CancelledError:
        if failed:
            raise failed[0] from None
        raise
    finally:
        bar.close()


async def score(
    trajectories: Sequence[Trajectory],
    samples: Sequence[Sample],
    metrics: dict[str, Any],
    functions: Sequence[Any],
    no_reward: str | None,
) -> tuple[list[Trajectory], list[float | None], dict[str, Any]]:
    """The trajectories (a reward a judge could not give filed as ``reward_unavailable``), each
    episode's reward (None: unknown, an infrastructure failure) and the metrics with the reward's
    (see the module docstring)."""
    from ..inputs.rewards import compute_rewards, mean_or_none, record_unavailable

    rewards = await compute_rewards(trajectories, samples, functions)
    trajectories = record_unavailable(trajectories, rewards)
    totals = [None if t.outcome == "infra_failure" else r for t, r in zip(trajectories, rewards.totals)]
    known = [r for r in totals if r is not None]
    metrics = {**metrics, "mean_reward": sum(known) / len(known) if known and no_reward is None else None}
    if functions:
        metrics["reward_functions"] = {name: mean_or_none(values) for name, values in rewards.per_function.items()}
        metrics["infra_failures"] = sum(t.outcome == "infra_failure" for t in trajectories)
        if rewards.errors:
            metrics["reward_function_errors"] = rewards.errors
    if no_reward is not None:  # the environments' zeros are no one's rewards
        metrics.update(mean_total_reward=None, max_total_reward=None, min_total_reward=None, rewarded_episodes=0)
        metrics["per_task"] = {
            task: {**values, "mean_total_reward": None, "rewarded_episodes": 0}
            for task, values in metrics.get("per_task", {}).items()
        }
        metrics["no_reward"] = no_reward
    return list(trajectories), totals, metrics


class PartialWriter:
    """Appends JSON records to a file, each as one whole line (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0

    def append(self, record: dict) -> None:
        data = (json.dumps(record) + "\n").encode()
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):  # cut the torn line off again
                os.ftruncate(self._fd, self._size)
                os.lseek(self._fd, self._size, os.SEEK_SET)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self._size += written

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "PartialWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_partial(path: Path) -> list[dict]:
    """The records of a ``.partial`` file; an incomplete last line (no newline) is ignored."""
    data = Path(path).read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in whole.decode().splitlines() if line]


def write_results(
    out: Path, trajectories: Sequence[Trajectory], metrics: dict, rewards: Sequence[float | None] | None = None
) -> None:
    """``trajectories.jsonl`` (input order; each record with its ``reward`` when ``rewards`` are
    given) and ``metrics.json``, each written atomically."""
    records = [t.to_json() for t in trajectories]
    if rewards is not None:
        records = [{**record, "reward": reward} for record, reward in zip(records, rewards)]
    atomic_write(out / "trajectories.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    atomic_write(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
