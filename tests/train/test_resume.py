"""Checkpoints: a run killed with SIGKILL and resumed ends with the same steps and draws exactly the
prompts the uninterrupted run drew, none twice and none skipped."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from rollforge.train import checkpoint as ckpt
from rollforge.train.loop import train

STEPS = 24


def _prompt_ids(run_dir, step):
    lines = (run_dir / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()
    return [int(re.search(r"\((\d+)\)", _user(json.loads(line))).group(1)) for line in lines]


def _user(trajectory):
    return next(m["content"] for m in trajectory["messages"] if m["role"] == "user")


def _cli(config_path, *extra):
    return [sys.executable, "-m", "rollforge.cli.main", "train", str(config_path), *extra]


@pytest.mark.slow
def test_sigkill_then_resume_matches_the_uninterrupted_run(tiny_config, tmp_path):
    reference = train(tiny_config(f"steps={STEPS}", f"out={tmp_path / 'reference'}"), console=False)
    config = tiny_config(f"steps={STEPS}", f"out={tmp_path / 'killed'}", "checkpoint_every=3", "keep_checkpoints=2")
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    run_dir = tmp_path / "killed"

    process = subprocess.Popen(_cli(config_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        latest = ckpt.latest_checkpoint(run_dir / "checkpoints")
        if latest is not None and latest.name >= "step-000006":
            break
        time.sleep(0.01)
    assert process.poll() is None, "the run finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = json.loads((ckpt.latest_checkpoint(run_dir / "checkpoints") / "state.json").read_text())["step"]
    assert 6 <= killed_at < STEPS

    resumed = subprocess.run(_cli(config_path, "--resume"), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # every step exactly once, none lost, none repeated
    drawn = [_prompt_ids(run_dir, s) for s in range(1, STEPS + 1)]
    assert drawn == [_prompt_ids(reference.out, s) for s in range(1, STEPS + 1)]
    per_step = [sorted(set(ids)) for ids in drawn]  # 4 prompts x 8 generations per step
    flat = [i for ids in per_step for i in ids]
    assert len(flat) == STEPS * 4
    epoch = 64  # prompts in the data: within an epoch no prompt comes twice
    assert len(set(flat[:epoch])) == len(flat[:epoch])
    assert len(list((run_dir / "checkpoints").glob("step-*"))) == 2  # keep_checkpoints


def test_checkpoint_restores_weights_optimizer_and_data_position(tiny_config, tmp_path):
    first = train(tiny_config("steps=2", "checkpoint_every=1"), console=False)
    assert ckpt.latest_checkpoint(first.out / "checkpoints").name == "step-000002"
    again = train(tiny_config("steps=4", "checkpoint_every=1"), resume=True, console=False)
    assert [m["step"] for m in again.history] == [1, 2, 3, 4]
    state = json.loads((ckpt.latest_checkpoint(again.out / "checkpoints") / "state.json").read_text())
    assert state["step"] == 4 and state["data"]["cursor"] == 16  # 4 steps x 4 prompts
