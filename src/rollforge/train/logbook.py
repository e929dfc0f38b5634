"""What a training run records: ``metrics.jsonl`` (one JSON object per step, flushed as written),
one console line per step (``console_line``: a step without an optimizer step says why; while a
step runs long, a ``Heartbeat`` line every 30 s says which step, how long, and its rollout's
episodes done), each step's trajectories under ``trajectories/step-NNNNNN.jsonl`` with
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
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

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
        self.heartbeat = Heartbeat(total_steps, start_step).start() if console else None

    def rolling(self, episodes: int) -> Callable[..., None] | None:
        """The step under way rolls out ``episodes`` episodes: an ``on_episode`` callback that
        counts them for the heartbeat's line (None without a console)."""
        return self.heartbeat.rolling(episodes) if self.heartbeat is not None else None

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
        if self.heartbeat is not None:
            self.heartbeat.step_done(metrics["step"])

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
        if self.heartbeat is not None:
            self.heartbeat.close()
        self._metrics.close()
        self.trackers.close()


#: Seconds a step may run without a line before the heartbeat prints one (and again each time as many pass).
HEARTBEAT_SECONDS = 30.0


class Heartbeat:
    """A short line on stderr whenever a step has printed nothing for ``every`` seconds (steps of
    22-129 s used to be silent until they ended): the step under way, how long it has run and,
    while it rolls out, its episodes done of the total (``rolling``, then ``episode`` per episode).
    ``poll`` decides and writes, with the clock it was given (tests pass their own); ``start`` runs
    it once a second on a daemon thread until ``close``."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        every: float = HEARTBEAT_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
        write: Callable[[str], None] | None = None,
    ):
        self.total_steps, self.every, self.clock = total_steps, every, clock
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.step = start_step + 1  # the step under way
        self.began = self.spoke = clock()
        self.episodes: tuple[int, int] | None = None  # (done, total) of the step's rollout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step_done(self, step: int) -> None:
        self.step, self.episodes = step + 1, None
        self.began = self.spoke = self.clock()

    def rolling(self, episodes: int) -> Callable[..., None]:
        """The step's rollout of ``episodes`` begins (a later round adds its own): the step's clock
        starts at its first rollout, so the held-out evaluation before step 1 is not counted in it."""
        if self.episodes is None:
            self.began = self.spoke = self.clock()
        self.episodes = (0, episodes)
        return self.episode

    def episode(self, *_: Any) -> None:
        if self.episodes is not None:
            self.episodes = (self.episodes[0] + 1, self.episodes[1])

    def poll(self) -> str | None:
        """The line, written, when ``every`` seconds passed since the last line or step; else None."""
        now = self.clock()
        if now - self.spoke < self.every:
            return None
        self.spoke = now
        line = self.line(now - self.began)
        self.write(line)
        return line

    def line(self, seconds: float) -> str:
        what = (
            f"step {self.step}/{self.total_steps}"
            if self.step <= self.total_steps
            else f"finishing after step {self.total_steps}/{self.total_steps}"
        )
        if self.episodes is not None:
            done, total = self.episodes
            what += f": rollout {done}/{total} episodes" if done < total else f": rolled out {total} episodes, updating"
        return f"  ... {what}, {seconds:.0f}s so far"

    def start(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._beat, name="rollforge-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            self.poll()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()


def console_line(m: dict[str, Any], total_steps: int) -> str:
    """The step's line: a GRPO step's reward, update and times; an SFT step's loss (``sft_line``).
    A step whose update took no optimizer step says so instead of showing a loss of 0."""
    if "reward/mean" not in m:
        return sft_line(m, total_steps)
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
    update = (
        f"no update: {no_update_reason(m)}"
        if m.get("micro_batches") == 0
        else f"loss {m['loss']:+.4f}  kl {m['kl']:.4f}  clip {m['clip_fraction']:.3f}  gnorm {m['grad_norm']:.3f}"
    )
    return (
        f"step {m['step']:>4}/{total_steps}  reward {reward}  [{per_env}]  {update}  "
        f"{m['time/step']:.1f}s ({rollout}, train {m['time/update']:.1f}s)"
    )


def no_update_reason(m: dict[str, Any]) -> str:
    """Why a step's update took no optimizer step (its ``micro_batches`` is 0): every group's
    rewards were equal (GRPO's advantages are then all 0), or no episode had a token to learn from."""
    groups, flat = m.get("advantage/groups"), m.get("advantage/zero_variance_groups")
    if groups and flat == groups:
        return f"all {groups} group{'s' if groups != 1 else ''} had equal rewards"
    return "no episode had a token with a learning signal"


def sft_line(m: dict[str, Any], total_steps: int) -> str:
    """An SFT step's line; a rejection-sampling round (``phase`` >= 1) is named, the sources' phase is not."""
    round_ = f"  round {m['phase']}" if m.get("phase") else ""
    return (
        f"sft step {m['step']:>4}/{total_steps}{round_}  loss {m['loss']:.4f}  gnorm {m['grad_norm']:.3f}  "
        f"tokens {m['loss_tokens']}/{m['tokens']}  {m['time/step']:.2f}s"
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
