"""Training on ranks under torchrun (gloo on CPU, FSDP2): the 2-rank update equals the 1-rank update
of the same batch, the tiny model learns on 2 ranks, and a run killed at 2 ranks resumes at 2 and at 1."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

import ranks_worker
from rollforge.models import load_model
from rollforge.train import checkpoint as ckpt
from rollforge.train.distributed import Ranks
from rollforge.train.losses import TokenMean

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def _torchrun(*args: str, nproc: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_two_ranks_take_the_one_rank_step_and_the_checkpoint_resumes_on_one(tiny_model_dir, tmp_path):
    done = _torchrun(str(HERE / "ranks_worker.py"), str(tiny_model_dir), str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    model, optimizer = ranks_worker.update(str(tiny_model_dir), Ranks())  # the whole batch in this process
    sharded = torch.load(tmp_path / "weights.pt")
    assert sharded.keys() == model.state_dict().keys()

    # the 2-rank optimizer state, resharded into one process: after one AdamW step the first moments
    # are 0.1 x the gradients, so they compare the two gradients (to 1e-5 once divided by 0.1)
    fresh, _ = load_model(str(tiny_model_dir))
    fresh.requires_grad_(True)
    restored = torch.optim.AdamW(fresh.parameters(), lr=1e-3, betas=(0.9, 0.99))
    loaded, skipped = ckpt.load_newest(tmp_path / "checkpoints")
    assert skipped == [] and loaded.step == 1
    ckpt.restore(loaded, fresh, restored, torch.optim.lr_scheduler.LambdaLR(restored, lambda _: 1.0))
    names = dict(model.named_parameters())
    expected = {names_of: optimizer.state[p]["exp_avg"] for names_of, p in names.items() if p in optimizer.state}
    got = {n: restored.state[p]["exp_avg"] for n, p in fresh.named_parameters() if p in restored.state}
    assert expected.keys() == got.keys() and len(got) > 5
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-6, rtol=0), name
    assert any(float(g.abs().max()) > 1e-4 for g in got.values())  # a real gradient, not zeros
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, sharded[name]), name


def test_a_checkpoint_rank_0_cannot_write_stops_every_rank_with_the_reason(tiny_model_dir, tmp_path):
    # a rank that waited for the process group's timeout (torch's default, 30 minutes) would run into this one
    done = _torchrun(str(HERE / "ranks_worker.py"), str(tiny_model_dir), str(tmp_path), "rank0-write", timeout=300)
    assert done.returncode != 0
    assert "rank 0 failed while writing checkpoint" in done.stderr and "rank 1 stops with it" in done.stderr
    assert "no space left on device" in done.stderr.lower()
    assert not (tmp_path / "checkpoints" / "latest").exists()
    assert not list((tmp_path / "checkpoints").glob(".step-*"))  # the partial checkpoint is gone


def test_global_normaliser_is_the_batch_total():
    masks = [torch.ones(3), torch.ones(5)]
    assert [w.sum().item() for w in TokenMean().weights(masks, lambda n: n * 2)] == [3 / 16, 5 / 16]


def _config(tmp_path: Path, tiny_model_dir: Path, data: Path, *extra: str) -> list[str]:
    config = tmp_path / "train.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {"name": str(tiny_model_dir)},
                "out": str(tmp_path / "run"),
                "data": {"path": str(data)},
                "environments": [{"name": "rollforge.testing:FirstCharacter", "task_name": "first"}],
                "algorithm": {"batch_size": 4, "group_size": 8},
                "rollout": {"max_new_tokens": 2, "max_turns": 1},
                "optim": {"lr": 1e-3},
                "save_trajectories": False,
            }
        )
    )
    return [str(config), *[a for item in extra for a in ("--set", item)]]


def _metrics(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_tiny_model_learns_on_two_ranks(tiny_model_dir, tmp_path, first_character_data):
    args = _config(tmp_path, tiny_model_dir, first_character_data, "steps=40", "checkpoint_every=0", "seed=1")
    done = subprocess.run(
        [sys.executable, "-m", "rollforge", "train", *args, "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    history = _metrics(tmp_path)
    assert [m["step"] for m in history] == list(range(1, 41)) and {m["ranks"] for m in history} == {2}
    rewards = [m["reward/mean"] for m in history]
    assert sum(rewards[:3]) / 3 < 0.35
    assert max(sum(rewards[i : i + 3]) / 3 for i in range(38)) > 0.9, rewards
    for m in history:  # a step trains whenever a group has reward variance; a step without any, nothing
        signal = m["advantage/zero_variance_groups"] < m["advantage/groups"]
        assert (m["policy_tokens"] > 0) == signal and (m["grad_norm"] > 0) == signal, m


def test_killed_two_rank_run_resumes_on_two_ranks_then_on_one(tiny_model_dir, tmp_path, first_character_data):
    args = _config(
        tmp_path, tiny_model_dir, first_character_data, "steps=30", "checkpoint_every=2", "keep_checkpoints=2"
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "rollforge",
        "train",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    latest = tmp_path / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 240
    while not (latest.is_file() and latest.read_text().strip() >= "step-000004") and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()[-3000:]
        time.sleep(0.2)
    ranks = psutil.Process(process.pid).children(recursive=True)  # torchrun starts them in sessions of their own
    for victim in (process, *ranks):  # SIGKILL, mid-run
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            victim.kill()
    process.wait()
    psutil.wait_procs(ranks, timeout=30)
    killed_at = len(_metrics(tmp_path))
    assert killed_at >= 4

    resumed = _torchrun("-m", "rollforge", "train", *args[:1], *args[1:], "--set", "steps=8", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [m["step"] for m in _metrics(tmp_path)] == list(range(1, 9))

    single = subprocess.run(
        [sys.executable, "-m", "rollforge", "train", *args, "--set", "steps=10", "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    history = _metrics(tmp_path)
    assert [m["step"] for m in history] == list(range(1, 11))
    assert [m.get("ranks") for m in history[8:]] == [None, None] and history[7]["ranks"] == 2
