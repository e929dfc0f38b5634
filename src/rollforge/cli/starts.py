"""What the training commands (``train``, ``sft``, ``quickstart``) do around a run, in one place.

Before the run: ``--resume`` with a config that differs from the run's ``config.yaml`` in anything
but the keys a resumed run may change (``steps``, where and how it runs: ``config_files.RESUMABLE``)
is refused in one line naming each changed key, and a resume with no step left to train says so
and exits 0 instead of reporting steps it did not train (``resume_start``). ``--nproc`` checks the
ranks' constraints (a batch that does not split over the ranks, ...) here, once, before torchrun
starts N copies that would each print the refusal and then a launcher traceback (``check_launch``).

During: a start that fails before it records a step leaves nothing behind (its ``config.yaml``, an
empty ``metrics.jsonl``, a tracker's folder, the run directory it created): the directory is as it
was (``clean_failed_start``).

After: the end-of-run summary (``train/report.summary``: steps, optimizer updates, reward first ->
last, wall time, where the run is) and, on rank 0, the report of a plain ``train`` run
(``report.md``, ``reward_curve.png``: ``finish_train``) and the loss curve of an ``sft`` run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from ..train import checkpoint as ckpt
from ..train.config_files import check_unchanged


def resume_start(config: Any, steps: float) -> int | None:
    """Check a ``--resume`` of ``config``'s run: a changed config is a ``ConfigError``; returns the
    step its newest checkpoint finished when that is ``steps`` or past it (nothing to train), else None."""
    out = Path(config.out)
    if ckpt.recorded(out) is None:
        return None  # nothing recorded yet: the run starts at step 1, with this config
    check_unchanged(out, config)
    latest = ckpt.latest_checkpoint(out / "checkpoints")
    done = ckpt.step_of(latest) if latest is not None else 0
    return done if done >= steps else None


def nothing_to_do(out: Path, done: int, steps: int, key: str = "steps") -> str:
    return (
        f"nothing to do: the run in {str(out)!r} finished step {done} and {key} is {steps}; to train further, "
        f"resume with a larger {key} (--set {key}={done + 1} or more)"
    )


def resumed_from(out: Path) -> int:
    """The step a ``--resume`` continues after (0: it starts at step 1)."""
    latest = ckpt.latest_checkpoint(Path(out) / "checkpoints")
    return ckpt.step_of(latest) if latest is not None else 0


def check_launch(config: Any, world: int) -> None:
    """What would refuse the run on ``world`` ranks, checked before torchrun starts them."""
    from ..train.distributed import Ranks
    from ..train.preflight import check_ranks

    check_ranks(config, Ranks(rank=0, world=world))


@contextlib.contextmanager
def clean_failed_start(out: Path) -> Iterator[None]:
    """Run the body; when it fails (or is interrupted) before ``out`` records a step (a checkpoint,
    metrics or trajectories), delete what it wrote there (``config.yaml``, an empty
    ``metrics.jsonl``, a tracker's folder) and ``out`` itself when the body created it."""
    out = Path(out)
    before = {p.name for p in out.iterdir()} if out.is_dir() else None
    try:
        yield
    except BaseException:
        if ckpt.recorded(out) is None and out.is_dir():
            for path in out.iterdir():
                if before is not None and path.name in before:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            if before is None:
                with contextlib.suppress(OSError):  # something else appeared there meanwhile
                    out.rmdir()
        raise


def main_rank() -> bool:
    """Whether this process is rank 0 (or the only one): the one that writes the run's report."""
    return os.environ.get("RANK", "0") == "0"


def finish_train(result: Any, since: int, wall_seconds: float) -> str | None:
    """Rank 0 writes ``report.md`` and ``reward_curve.png`` for the run (as the quickstart does) and
    returns the summary lines to print; the other ranks of a torchrun launch return None."""
    from ..train.report import summary, write_report

    if not main_rank():
        return None
    evaluations = result.evaluations or {}
    write_report(result.out, evaluations.get("before"), evaluations.get("after"), wall_seconds, evaluations)
    return summary(result.history, result.out, since=since, wall_seconds=wall_seconds) + (
        f" -- report: {Path(result.out) / 'report.md'}"
    )


def finish_sft(result: Any, wall_seconds: float, since: int = 0) -> str:
    """Rank 0 plots the loss per step (``loss_curve.png``); the summary lines to print (the steps
    after ``since``, a resumed run's checkpoint)."""
    from ..train.report import plot_rewards, summary

    line = summary(result.history, result.out, since=since, wall_seconds=wall_seconds, verb="fine-tuned")
    if main_rank() and (png := plot_rewards(result.history, Path(result.out) / "loss_curve.png")):
        line += f" -- loss curve: {png}"
    return line
