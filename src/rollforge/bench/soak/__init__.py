"""Hours under load through one engine (``rollforge bench soak``).

100,000 episodes (``--episodes``) in chunks of ``--chunk`` through one rollout session
(``open_session``: the environments prepared once, one event loop, one backend, one renderer),
each episode streamed as it ends to ``trajectories.jsonl.partial`` by the CLI's own writer
(``cli.rollout_results.PartialWriter``, as ``rollforge rollout`` does). Generation is the scripted
backend with no latency (no model: the soak tests the engine), writing one Hermes ``work`` call per
turn through the tiny test tokenizer's chat template. The environments inject faults in a fixed
mix (``faults.py``): tools that raise, resets that raise, tools that hang past the step timeout
(``step_timeout`` 0.25 s; the hung thread is abandoned and ends after 1 s), slow tools and observations of 50,000
characters (some 40,000 tokens) that ``max_seq_len`` (1,024) cuts. The warning rollforge logs for each
abandoned hung call is silenced meanwhile (``_quiet``): the calls are counted as ``env_timeout``.

After each chunk (the result dropped, a full collection) the process is sampled (``probes.py``):
the chunk's peak resident set, threads and open file descriptors. The figures:

- ``rss_peak_growth_pct``: the highest chunk peak of the last 10% of chunks over that of the first
  10% (the warm-up), minus one, in percent; ``memory_flat`` when under 10;
- ``threads`` / ``fds``: at the start, the highest of the first and of the last 10% of chunks
  (``thread_growth`` / ``fd_growth``: last minus first; abandoned hung threads end on their own,
  so the count plateaus rather than returning to its start);
- ``partial``: the file read back (whole, every index once, every ending the one its fault
  must produce); ``every_trajectory_written`` when lines, distinct indices and episodes agree;
- ``errors`` / ``tool_failures``: summed from the engine's metrics, beside ``expected`` (from the mix);
- ``episodes_per_second`` and the wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...backends.scripted import ScriptedBackend
from ...chat.render import ChatRenderer
from ...cli.rollout_results import PartialWriter
from ...errors import ConfigError
from ...rollout.config import RolloutConfig
from ...rollout.engine import arollout, open_session
from ...testing import make_tokenizer
from ...types import Sample as EpisodeSample
from ...workers import ENVIRONMENT_WORKERS
from . import probes
from .faults import EXPECTED, environments, kind_of

WORK_CALL = '<tool_call>\n{"name": "work", "arguments": {}}\n</tool_call>'


@dataclass(frozen=True)
class SoakSettings:
    episodes: int = 100_000
    chunk: int = 2_000  # episodes per arollout call through the one session
    concurrency: int = 64
    step_timeout: float = 0.25  # seconds; a hanging tool blocks past it
    hang_seconds: float = 1.0  # how long a hanging tool blocks its (abandoned) thread
    slow_seconds: float = 0.02  # how long a slow tool blocks
    huge_chars: int = 50_000  # characters of a huge observation
    max_seq_len: int = 1024

    def check(self) -> None:
        for name in ("episodes", "chunk", "concurrency", "huge_chars", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"bench soak: --{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if not self.slow_seconds < self.step_timeout < self.hang_seconds:
            raise ConfigError(
                f"bench soak: expected slow {self.slow_seconds} < step timeout {self.step_timeout} < hang "
                f"{self.hang_seconds} seconds"
            )


def run(settings: SoakSettings = SoakSettings(), out: Path | None = None) -> dict[str, Any]:
    """The soak (see the module docstring); ``out``: where ``trajectories.jsonl.partial`` is written
    and kept (None: a temporary directory, removed afterwards)."""
    settings.check()
    scratch = None if out is not None else Path(tempfile.mkdtemp(prefix="rollforge-soak-"))
    directory = Path(out) if out is not None else scratch
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / "trajectories.jsonl.partial"
    try:
        start = probes.sample(probes.status_kb("VmHWM"))
        started = time.perf_counter()
        with PartialWriter(partial) as stream, _quiet(logging.getLogger("rollforge.workers")):
            chunks, metrics = asyncio.run(_soak(settings, stream))
            ENVIRONMENT_WORKERS.wait_finished(2 * settings.hang_seconds)  # the last hung calls end, quietly
        wall = time.perf_counter() - started
        check = probes.check_partial(partial, settings.episodes)
        return _report(settings, start, chunks, metrics, check, wall) | {
            "partial_path": None if scratch else str(partial)
        }
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """Errors only from ``logger`` meanwhile: each of the ~10,000 hung calls would warn once when
    abandoned (counted instead, as ``env_timeout``)."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


async def _soak(settings: SoakSettings, stream: PartialWriter) -> tuple[list[probes.Sample], dict[str, Any]]:
    """Every chunk through one session; a process sample after each, and the engine's metrics summed."""
    renderer = ChatRenderer(make_tokenizer())
    backend = ScriptedBackend(lambda request: WORK_CALL, renderer.tokenizer, end_token_id=renderer.stop_token_ids[0])
    envs = environments(settings.hang_seconds, settings.slow_seconds, settings.huge_chars)
    config = RolloutConfig(
        max_turns=3,
        concurrency=settings.concurrency,
        max_seq_len=settings.max_seq_len,
        max_new_tokens=64,
        step_timeout=settings.step_timeout,
        tool_parser="hermes",
    )
    totals: dict[str, Counter[str]] = {"errors": Counter(), "failures": Counter(), "on_episode_errors": Counter()}
    chunks: list[probes.Sample] = []

    def write(trajectory) -> None:
        stream.append(trajectory.to_json())

    async with open_session(envs, settings.concurrency) as session:
        for first in range(0, settings.episodes, settings.chunk):
            samples = _samples(first, min(settings.chunk, settings.episodes - first))
            gc.collect()
            peak_reset = probes.reset_peak()
            result = await arollout(
                samples, envs, backend, renderer, config.model_copy(update={"first_index": first}),
                on_episode=write, session=session,
            )  # fmt: skip
            _add(totals, result.metrics)
            del result, samples
            gc.collect()
            chunks.append(probes.sample(probes.status_kb("VmHWM")))
    backend_metrics = {"peak_reset": peak_reset, "backend_calls": backend.calls}
    return chunks, {name: dict(sorted(c.items())) for name, c in totals.items()} | backend_metrics


def _samples(first: int, count: int) -> list[EpisodeSample]:
    return [
        EpisodeSample(prompt=[{"role": "user", "content": f"Episode {i}."}], task_name=kind_of(i))
        for i in range(first, first + count)
    ]


def _add(totals: dict[str, Counter[str]], metrics: dict[str, Any]) -> None:
    totals["errors"].update(metrics["errors"])
    totals["failures"].update(metrics["failures"])
    totals["on_episode_errors"]["count"] += metrics["on_episode_errors"]


def expected_counts(episodes: int) -> dict[str, dict[str, int]]:
    """The episodes of each fault, and the errors and tool failures the mix must produce."""
    kinds = Counter(kind_of(i) for i in range(episodes))
    errors: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    for kind, count in kinds.items():
        _, error, tool_failures = EXPECTED[kind]
        if error:
            errors[error] += count
        for failure in tool_failures:
            failures[failure] += count
    return {"kinds": dict(sorted(kinds.items())), "errors": dict(errors), "tool_failures": dict(failures)}


def _window(chunks: Sequence[probes.Sample], field: str) -> tuple[float, float]:
    """The highest ``field`` over the first and over the last 10% of chunks (at least one each)."""
    tenth = max(len(chunks) // 10, 1)
    return max(getattr(c, field) for c in chunks[:tenth]), max(getattr(c, field) for c in chunks[-tenth:])


def _report(settings, start, chunks, metrics, check, wall) -> dict[str, Any]:
    first_rss, last_rss = _window(chunks, "peak_rss_mb")
    growth = 100 * (last_rss / first_rss - 1)
    threads, fds = _window(chunks, "threads"), _window(chunks, "fds")
    expected = expected_counts(settings.episodes)
    return {
        "benchmark": "soak",
        "settings": asdict(settings),
        "episodes": settings.episodes,
        "chunks": len(chunks),
        "wall_seconds": round(wall, 1),
        "episodes_per_second": round(settings.episodes / wall, 1),
        "rss_start_mb": start.rss_mb,
        "rss_peak_first_10pct_mb": first_rss,
        "rss_peak_last_10pct_mb": last_rss,
        "rss_peak_growth_pct": round(growth, 2),
        "memory_flat": growth < 10,
        "threads": {"start": start.threads, "first_10pct_max": threads[0], "last_10pct_max": threads[1]},
        "thread_growth": threads[1] - threads[0],
        "fds": {"start": start.fds, "first_10pct_max": fds[0], "last_10pct_max": fds[1]},
        "fd_growth": fds[1] - fds[0],
        "errors": metrics["errors"],
        "tool_failures": metrics["failures"],
        "expected": expected,
        "faults_as_injected": metrics["errors"] == expected["errors"]
        and metrics["failures"] == expected["tool_failures"],
        "on_episode_errors": metrics["on_episode_errors"].get("count", 0),
        "backend_calls": metrics["backend_calls"],
        "peak_reset": metrics["peak_reset"],
        "partial": check.to_json(),
        "every_trajectory_written": check.lines == check.distinct_indices == settings.episodes,
        "per_chunk": {name: [getattr(c, name) for c in chunks] for name in ("peak_rss_mb", "threads", "fds")},
    }


def add_arguments(parser: Any) -> None:
    defaults = SoakSettings()
    parser.add_argument("--episodes", type=int, default=defaults.episodes)
    parser.add_argument("--chunk", type=int, default=defaults.chunk, help="episodes per rollout through the session")
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument(
        "--out", type=Path, default=None, help="directory that keeps the .partial file (default: a temporary one)"
    )


def main(args: Any) -> dict[str, Any]:
    settings = SoakSettings(episodes=args.episodes, chunk=args.chunk, concurrency=args.concurrency)
    return run(settings, args.out)
