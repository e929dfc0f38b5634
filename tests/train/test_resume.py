"""Checkpoints: a run killed with SIGKILL and resumed ends with the same steps and draws exactly the
prompts the uninterrupted run drew, none twice and none skipped. Damaged checkpoints are skipped
with a warning naming them, or resuming fails in one line; the history is never wiped."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from rollforge.cli.main import main
from rollforge.errors import CheckpointError
from rollforge.recipes.launch import train
from rollforge.train import checkpoint as ckpt

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
    assert not list((run_dir / "checkpoints").glob(".step-*"))  # no temporary directory left behind


def test_checkpoint_restores_weights_optimizer_and_data_position(tiny_config, tmp_path):
    first = train(tiny_config("steps=2", "checkpoint_every=1"), console=False)
    assert ckpt.latest_checkpoint(first.out / "checkpoints").name == "step-000002"
    again = train(tiny_config("steps=4", "checkpoint_every=1"), resume=True, console=False)
    assert [m["step"] for m in again.history] == [1, 2, 3, 4]
    state = json.loads((ckpt.latest_checkpoint(again.out / "checkpoints") / "state.json").read_text())
    assert state["step"] == 4 and state["data"]["cursor"] == 16  # 4 steps x 4 prompts


# --- damaged checkpoints: --resume falls back to the newest complete one, or fails; history is kept ---


def _trained(tiny_config):
    """A 3-step run with a checkpoint after every step: step-000001..3."""
    result = train(tiny_config("steps=3", "checkpoint_every=1", "keep_checkpoints=3"), console=False)
    root = result.out / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000001", "step-000002", "step-000003"]
    return result.out, root


def test_resume_skips_damaged_checkpoints_newest_first(tiny_config, tmp_path):
    out, root = _trained(tiny_config)
    assert ckpt.load_newest(root)[0].step == 3

    (root / "latest").write_text("step-000007\n")  # a pointer to a directory that is gone
    loaded, skipped = ckpt.load_newest(root)
    assert loaded.step == 3 and skipped == ["'latest' names 'step-000007', which does not exist"]

    weights = root / "step-000003" / "model" / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])  # truncated weights
    loaded, skipped = ckpt.load_newest(root)
    assert loaded.step == 2
    assert (
        skipped[1]
        == f"step-000003/model/model.safetensors is {size // 2} bytes, expected {size} bytes (truncated or damaged)"
    )

    (root / "step-000002" / "state.json").unlink()  # a checkpoint that was never completed
    loaded, skipped = ckpt.load_newest(root)
    assert loaded.step == 1 and skipped[2] == "step-000002 has no state.json (it was never completed)"

    # a checkpoint from before the manifest, with a truncated optimizer state: found by reading it
    state = json.loads((root / "step-000001" / "state.json").read_text())
    del state["files"]
    (root / "step-000001" / "state.json").write_text(json.dumps(state))
    optimizer = root / "step-000001" / "optimizer" / ".metadata"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    loaded, skipped = ckpt.load_newest(root)
    assert loaded is None and len(skipped) == 4 and skipped[3].startswith("step-000001 cannot be read: ")


def test_resume_from_an_older_checkpoint_keeps_the_history_before_it(tiny_config, caplog):
    out, root = _trained(tiny_config)
    before = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (root / "step-000003" / "state.json").unlink()
    orphan = root / ".step-000004.tmp-99999"  # what a run killed while writing leaves behind
    (orphan / "model").mkdir(parents=True)
    with caplog.at_level("WARNING"):
        again = train(tiny_config("steps=4", "checkpoint_every=1", "keep_checkpoints=3"), resume=True, console=False)
    assert [m["step"] for m in again.history] == [1, 2, 3, 4]
    assert again.history[:2] == before[:2]  # the steps before the checkpoint are the original lines
    assert "after skipping: step-000003 has no state.json" in caplog.text
    assert f"deleted {orphan}" in caplog.text and not orphan.exists()
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000002", "step-000003", "step-000004"]


def test_resume_without_a_usable_checkpoint_fails_and_keeps_everything(tiny_config, tmp_path, capsys):
    out, root = _trained(tiny_config)
    for step in (1, 2, 3):
        (root / f"step-{step:06d}" / "state.json").unlink()
    metrics = (out / "metrics.jsonl").read_text()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config("steps=4").model_dump(mode="json")))
    capsys.readouterr()
    assert main(["train", str(config_path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"rollforge: error: cannot resume {str(out)!r}: no usable checkpoint")
    assert "step-000003 has no state.json" in err and "metrics.jsonl records steps up to 3" in err
    assert (out / "metrics.jsonl").read_text() == metrics  # nothing wiped
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000001", "step-000002", "step-000003"]


def test_resume_of_a_run_that_never_checkpointed_is_refused(tiny_config):
    first = train(tiny_config("steps=2"), console=False)  # checkpoint_every=0: only at the end...
    for path in (first.out / "checkpoints").glob("step-*"):
        (path / "state.json").unlink()  # ...and that one was never completed
    (first.out / "checkpoints" / "latest").unlink()
    with pytest.raises(CheckpointError, match="metrics.jsonl records steps up to 2"):
        train(tiny_config("steps=3"), resume=True, console=False)
    assert [json.loads(line)["step"] for line in (first.out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_of_a_new_run_starts_at_step_one(tiny_config, tmp_path):
    result = train(tiny_config("steps=1", f"out={tmp_path / 'fresh'}"), resume=True, console=False)
    assert [m["step"] for m in result.history] == [1]


def test_the_cli_warns_in_one_line_what_it_skipped(tiny_config, tmp_path, capsys):
    out, root = _trained(tiny_config)
    (root / "step-000003" / "state.json").unlink()
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(tiny_config("steps=3").model_dump(mode="json")))
    capsys.readouterr()
    assert main(["train", str(config_path), "--resume"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rollforge: warning:")]
    assert warnings == [
        f"rollforge: warning: resuming from {root / 'step-000002'} after skipping: "
        "step-000003 has no state.json (it was never completed)"
    ]
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
