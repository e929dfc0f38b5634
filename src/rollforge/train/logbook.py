"""What a training run records: ``metrics.jsonl`` (one JSON object per step, flushed as written),
one console line per step, each step's trajectories under ``trajectories/step-NNNNNN.jsonl`` with
their reward and advantage, and a copy for the trackers ``report_to`` names (``trackers.py``: the
config, each step's scalars and a few of its completions; by default TensorBoard when installed).

On resume, lines of ``metrics.jsonl`` for steps after the checkpoint (written by the run that
died) are dropped, so the file ends up with every step exactly once.

A full disk is one ``OSError`` (ENOSPC) naming the file that could not be written, where the
writer's own names none; ``out_of_space`` tells it apart for writers that lose the errno.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from ..files import FULL_DISK, atomic_write, space_for
from ..types import Trajectory
from .trackers import completion_rows, open_trackers


class Logbook:
    def __init__(
        self,
        out: Path,
        total_steps: int,
        start_step: int = 0,
        console: bool = True,
        report_to: Sequence[str] | None = None,
        config: dict[str, Any] | None = None,
    ):
        self.out = out
        self.total_steps = total_steps
        self.console = console
        out.mkdir(parents=True, exist_ok=True)
        self.metrics_path = out / "metrics.jsonl"
        _truncate_after(self.metrics_path, start_step)
        self._metrics = self.metrics_path.open("a")
        try:
            self.trackers = open_trackers(report_to, out, config)
        except BaseException:
            self._metrics.close()
            raise

    def log(self, metrics: dict[str, Any]) -> None:
        with space_for(self.metrics_path):
            self._metrics.write(json.dumps(metrics) + "\n")
            self._metrics.flush()
        self.trackers.log_metrics(
            metrics["step"],
            {
                key: value
                for key, value in metrics.items()
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step"
            },
        )
        if self.console:
            print(console_line(metrics, self.total_steps), file=sys.stderr, flush=True)

    def save_trajectories(
        self, step: int, trajectories: Sequence[Trajectory], rewards: Sequence[float], advantages: Sequence[float]
    ) -> None:
        folder = self.out / "trajectories"
        folder.mkdir(exist_ok=True)
        path = folder / f"step-{step:06d}.jsonl"
        atomic_write(
            path,
            "".join(
                json.dumps({**t.to_json(), "reward": reward, "advantage": advantage}) + "\n"
                for t, reward, advantage in zip(trajectories, rewards, advantages)
            ),
        )
        self.trackers.log_completions(step, completion_rows(step, trajectories, rewards, advantages))

    def close(self) -> None:
        self._metrics.close()
        self.trackers.close()


def console_line(m: dict[str, Any], total_steps: int) -> str:
    per_env = "  ".join(
        f"{k.removeprefix('reward/env/')} {v:.2f}"
        for k, v in m.items()
        if k.startswith("reward/env/") and v is not None
    )
    reward = "n/a" if m["reward/mean"] is None else f"{m['reward/mean']:.3f}"  # every episode failed (infra)
    if "async/rollout_seconds" in m:  # asynchronous: the batch's rollout overlapped the previous updates
        rollout = f"gen+env {m['async/rollout_seconds']:.1f}s overlapped, waited {m['time/wait']:.1f}s"
    else:
        rollout = f"gen+env {m['time/rollout']:.1f}s"
    return (
        f"step {m['step']:>4}/{total_steps}  reward {reward}  [{per_env}]  "
        f"loss {m['loss']:+.4f}  kl {m['kl']:.4f}  clip {m['clip_fraction']:.3f}  "
        f"gnorm {m['grad_norm']:.3f}  {m['time/step']:.1f}s ({rollout}, train {m['time/update']:.1f}s)"
    )


_NEARLY_FULL = 1 << 20  # bytes free below which a failed write is put down to the disk


def out_of_space(error: BaseException, where: Path) -> bool:
    """Whether ``error``, raised writing under ``where``, means the disk (or a quota) is full: an
    ENOSPC or EDQUOT ``OSError`` in it, behind it, or among the failures it collects (DCP's
    ``CheckpointException``); or, for writers that lose the errno (torch.save's "unexpected pos",
    safetensors), less than 1 MiB left on ``where``'s file system."""
    seen = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__
    seen += [e for s in seen for e, *_ in getattr(s, "failures", {}).values() if isinstance(e, BaseException)]
    if any(isinstance(e, OSError) and e.errno in FULL_DISK for e in seen):
        return True
    if not any(isinstance(e, Exception) for e in seen):  # an interrupt, not a failed write
        return False
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free < _NEARLY_FULL
    except OSError:
        return False


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of ``path`` (a torn last line from a killed run is skipped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _truncate_after(path: Path, step: int) -> None:
    kept = [m for m in read_metrics(path) if m.get("step", 0) <= step] if step else []
    atomic_write(path, "".join(json.dumps(m) + "\n" for m in kept))
