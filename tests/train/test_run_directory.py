"""The run directory as users meet it: a fresh run never mixes with the one a directory holds
(refused in one line, or ``--overwrite``), ``--resume`` follows ``latest``, a full disk is one line
that leaves what is on disk valid, and Ctrl-C during a checkpoint exits 130 with that checkpoint."""

import contextlib
import errno
import json
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import yaml

from rollforge.cli.main import main
from rollforge.errors import CheckpointError, ConfigError
from rollforge.files import write_json
from rollforge.recipes.launch import train
from rollforge.train import checkpoint as ckpt
from rollforge.train.config import LoraConfig, ModelConfig, OptimConfig
from rollforge.train.logbook import Logbook
from rollforge.train.policy import load_policy, make_optimizer
from rollforge.train.update import TrainedPolicy


def _steps(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _names(folder, pattern="step-*"):
    return sorted(p.name for p in folder.glob(pattern))


def _config_file(tiny_config, tmp_path, *overrides):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(*overrides).model_dump(mode="json")))
    return path


def _one_line(capsys, argv, code=2):
    capsys.readouterr()
    assert main(argv) == code
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rollforge:")]
    assert len(err) == 1, err
    return err[0]


# --- a fresh run into a directory that holds a run ---


def test_a_fresh_run_into_a_used_out_is_refused_then_overwritten_then_resumed(tiny_config, tmp_path, capsys):
    """The issue's sequence: steps=3, then steps=1 without --resume, then --resume to 5."""
    config = _config_file(tiny_config, tmp_path, "checkpoint_every=1")
    out = tmp_path / "run"
    assert main(["train", str(config), "--set", "steps=3"]) == 0
    before = (out / "metrics.jsonl").read_text()

    line = _one_line(capsys, ["train", str(config), "--set", "steps=1"])
    assert line == (
        f"rollforge: error: out {str(out)!r} already holds a run (metrics.jsonl records steps up to 3); "
        "continue it with --resume, or start over with --overwrite (deletes it) or another out"
    )
    assert (out / "metrics.jsonl").read_text() == before  # refused before anything was touched
    assert _names(out / "checkpoints") == ["step-000002", "step-000003"]

    assert main(["train", str(config), "--set", "steps=1", "--overwrite"]) == 0
    assert _steps(out) == [1]
    assert _names(out / "checkpoints") == ["step-000001"] and _names(out / "trajectories") == ["step-000001.jsonl"]
    assert (out / "checkpoints" / "latest").read_text() == "step-000001\n"

    assert main(["train", str(config), "--set", "steps=3", "--resume"]) == 0
    assert _steps(out) == [1, 2, 3]
    assert _names(out / "checkpoints") == ["step-000002", "step-000003"]


def test_resume_and_overwrite_exclude_each_other(tiny_config, tmp_path, capsys):
    with pytest.raises(ConfigError, match="resume and overwrite exclude each other"):
        train(tiny_config(), resume=True, overwrite=True, console=False)
    config = _config_file(tiny_config, tmp_path)
    capsys.readouterr()
    assert main(["train", str(config), "--resume", "--overwrite"]) == 2
    assert capsys.readouterr().err.startswith(
        "rollforge train: error: argument --overwrite: not allowed with argument --resume"
    )
    assert not (tmp_path / "run").exists()


def test_what_counts_as_a_run_already_there(tiny_config, tmp_path):
    out = tmp_path / "run"
    assert ckpt.recorded(out) is None  # not there yet
    out.mkdir()
    (out / "config.yaml").write_text("steps: 3\n")
    (out / "eval.json").write_text("{}")  # a run stopped before step 1, or the quickstart's base evaluation
    (out / "metrics.jsonl").write_text('{"step": 1, "loss"')  # a torn line records nothing
    assert ckpt.recorded(out) is None
    ckpt.start_fresh(out, overwrite=False)
    (out / "trajectories").mkdir()
    (out / "trajectories" / "step-000004.jsonl").write_text("")
    assert ckpt.recorded(out) == "trajectories up to step-000004.jsonl"
    (out / "checkpoints" / "step-000002").mkdir(parents=True)
    assert ckpt.recorded(out) == "checkpoint step-000002"
    (out / "warmup" / "checkpoints").mkdir(parents=True)  # the quickstart's warm-up run and report
    (out / "report.md").write_text("# Quickstart report\n")
    keep = out / "notes.txt"  # not rollforge's: --overwrite leaves it
    keep.write_text("mine")
    ckpt.start_fresh(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_resume_follows_latest_not_the_newest_directory(tiny_config):
    result = train(tiny_config("steps=3", "checkpoint_every=1", "keep_checkpoints=3"), console=False)
    root = result.out / "checkpoints"
    (root / "latest").write_text("step-000002\n")  # e.g. a run killed after the rename, before the pointer
    loaded, skipped = ckpt.load_newest(root)
    assert loaded.step == 2
    assert skipped == ["step-000003 is newer than the step-000002 that 'latest' names"]


def test_sft_into_a_used_out_is_refused_with_the_resume_hint(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "sft"
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {{name: {tiny_model_dir}}}\nout: {out}\nbatch_size: 4\n"
        "sources:\n  - {kind: expert, env: echo, episodes: 4}\n"
        "rollout: {max_turns: 2, max_new_tokens: 64, max_seq_len: 1024}\n"
    )
    (out / "checkpoints" / "step-000007").mkdir(parents=True)
    line = _one_line(capsys, ["sft", str(config)])
    assert line == (
        f"rollforge: error: out {str(out)!r} already holds a run (checkpoint step-000007); "
        "continue it with --resume, or start over with --overwrite (deletes it) or another out"
    )
    assert main(["sft", str(config), "--overwrite"]) == 0
    assert _names(out / "checkpoints") == ["step-000001"] and _steps(out) == [1]


def test_quickstart_into_a_used_out_is_refused_before_it_evaluates(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "qs"
    (out / "warmup").mkdir(parents=True)
    (out / "warmup" / "metrics.jsonl").write_text('{"step": 2}\n')  # a warm-up that was interrupted
    line = _one_line(capsys, ["quickstart", "--out", str(out), "--model", str(tiny_model_dir)])
    assert line.startswith(
        f"rollforge: error: out {str(out / 'warmup')!r} already holds a run "
        "(metrics.jsonl records steps up to 2); continue it with --resume"
    )
    assert not (out / "eval.json").exists()


# --- a full disk ---


@pytest.fixture
def pieces(tiny_model_dir):
    """What ``save_checkpoint`` writes: the tiny model with AdamW and its schedule, and its tokenizer."""
    model, tokenizer = load_policy(ModelConfig(name=str(tiny_model_dir)), LoraConfig())
    optimizer, scheduler = make_optimizer(model, OptimConfig(), 4)
    return TrainedPolicy(model, optimizer, scheduler), tokenizer


def _full_disk(monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 20, 10 << 20, 0))


def test_a_checkpoint_that_finds_the_disk_full_is_one_line_and_leaves_the_previous_one(pieces, tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    ckpt.save_checkpoint(root, 1, *pieces, {"cursor": 4}, keep=2)

    def short_write(*args, **kwargs):  # what torch.save raises when the disk fills (no errno)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(ckpt.torch, "save", short_write)
    _full_disk(monkeypatch)
    with pytest.raises(CheckpointError) as caught:
        ckpt.save_checkpoint(root, 2, *pieces, {"cursor": 8}, keep=2)
    assert str(caught.value) == (
        f"cannot write checkpoint {str(root / 'step-000002')!r}: no space left on device; the checkpoints before "
        "it are intact: free space, then continue with --resume"
    )
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000001"]  # the temporary one is gone
    assert ckpt.load_newest(root)[0].step == 1


def test_one_process_checkpoints_whatever_process_group_state_another_library_left(pieces, tmp_path, monkeypatch):
    """`vs-trl --best` failed at its final run's checkpoint: an in-process vLLM engine of an earlier
    candidate had created a process group and tore it down meanwhile, so DCP saw one at its start
    and found no default group at its first collective. One process writes and reads alone."""
    import sys

    import torch.distributed as dist

    def ghost_group() -> bool:  # DCP sees a group at its start; there is none by its first collective
        return sys._getframe(1).f_globals.get("__name__", "").startswith("torch.distributed.checkpoint")

    root = tmp_path / "checkpoints"
    monkeypatch.setattr(dist, "is_initialized", ghost_group)
    ckpt.save_checkpoint(root, 1, *pieces, {"cursor": 4}, keep=2)
    policy, _ = pieces
    loaded, _ = ckpt.load_newest(root)
    ckpt.restore(loaded, policy.model, policy.optimizer, policy.scheduler)
    assert loaded.step == 1


def test_a_checkpoint_failure_with_space_left_is_not_called_a_full_disk(pieces, tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"

    def broken(*args, **kwargs):
        raise RuntimeError("unexpected pos 1 vs 0")

    monkeypatch.setattr(ckpt.torch, "save", broken)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 << 30, 0, 10 << 30))
    with pytest.raises(RuntimeError, match="unexpected pos 1 vs 0"):
        ckpt.save_checkpoint(root, 1, *pieces, {"cursor": 4}, keep=2)
    assert list(root.iterdir()) == []


def test_an_optimizer_shard_that_finds_the_disk_full_is_a_checkpoint_error(pieces, tmp_path, monkeypatch):
    from torch.distributed.checkpoint.api import CheckpointException

    def full(state, directory, alone):  # DCP collects each rank's failure, with its errno
        raise CheckpointException(
            "write", {0: (OSError(errno.ENOSPC, "No space left on device"), traceback.StackSummary())}
        )

    monkeypatch.setattr(ckpt, "_dcp_save", full)
    with pytest.raises(CheckpointError, match="no space left on device"):
        ckpt.save_checkpoint(tmp_path / "checkpoints", 1, *pieces, {"cursor": 4}, keep=2)
    assert list((tmp_path / "checkpoints").iterdir()) == []


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_metrics_and_trajectories_on_a_full_disk_name_their_file(tmp_path):
    logbook = Logbook(tmp_path / "run", total_steps=3, console=False)
    logbook._metrics.close()
    logbook._metrics = open("/dev/full", "a")  # every write: ENOSPC
    with pytest.raises(OSError) as caught:
        logbook.log({"step": 1, "loss": 0.5})
    with contextlib.suppress(OSError):
        logbook._metrics.close()  # closed, though the buffered line cannot be flushed
    assert caught.value.errno == errno.ENOSPC
    assert (
        str(caught.value)
        == f"[Errno {errno.ENOSPC}] no space left on device: {str(tmp_path / 'run' / 'metrics.jsonl')!r}"
    )

    folder = tmp_path / "run" / "trajectories"
    folder.mkdir()
    (folder / "step-000001.jsonl.tmp").symlink_to("/dev/full")
    with pytest.raises(OSError, match=f"no space left on device: {str(folder / 'step-000001.jsonl')!r}"):
        logbook.save_trajectories(1, [_Row()], [1.0], [0.0])
    assert list(folder.iterdir()) == []

    evaluations = tmp_path / "run" / "eval.json"  # the run's small files: config.yaml, eval.json
    (tmp_path / "run" / "eval.json.tmp").symlink_to("/dev/full")
    with pytest.raises(OSError, match=f"no space left on device: {str(evaluations)!r}"):
        write_json(evaluations, {"before": {"mean_reward": 0.5}})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["metrics.jsonl", "trajectories"]


class _Row:
    def to_json(self):
        return {"messages": [{"role": "user", "content": "x" * 10000}]}


@pytest.fixture
def small_disk(tmp_path):
    """``mount(size)``: a tmpfs of ``size`` bytes at tmp_path/disk (root only; skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()

    def mount(size: int):
        options = f"size={size}" if not mounted else f"remount,size={size}"
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)], capture_output=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(size)
        return disk

    mounted = []
    yield mount
    if mounted:  # lazily: memory-mapped checkpoint weights may still be referenced
        subprocess.run(["umount", "--lazy", str(disk)], check=True, timeout=30)


def test_training_into_a_full_disk_stops_in_one_line_and_resumes_once_freed(tiny_config, tmp_path, small_disk, capsys):
    disk = small_disk(64 << 20)
    out = disk / "run"
    config = _config_file(tiny_config, tmp_path, f"out={out}", "checkpoint_every=1")
    assert main(["train", str(config), "--set", "steps=1"]) == 0
    checkpoint = sum(p.stat().st_size for p in (out / "checkpoints" / "step-000001").rglob("*") if p.is_file())
    used = shutil.disk_usage(disk).used
    small_disk(used + checkpoint // 2)  # room for step 2's metrics and trajectories, not its checkpoint

    line = _one_line(capsys, ["train", str(config), "--set", "steps=3", "--resume"])
    assert line == (
        f"rollforge: error: cannot write checkpoint {str(out / 'checkpoints' / 'step-000002')!r}: no space "
        "left on device; the checkpoints before it are intact: free space, then continue with --resume"
    )
    assert _names(out / "checkpoints", "*step-*") == ["step-000001"]  # no temporary directory left
    loaded, skipped = ckpt.load_newest(out / "checkpoints")
    assert loaded.step == 1 and skipped == []

    small_disk(64 << 20)  # space freed
    assert main(["train", str(config), "--set", "steps=3", "--resume"]) == 0
    assert _steps(out) == [1, 2, 3]


# --- Ctrl-C while a checkpoint is written ---

_INTERRUPTED_RUN = """
import os, signal, sys, time
from rollforge.train import checkpoint as ckpt

signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever the parent ignored
save = ckpt.save_checkpoint

def save_after_ctrl_c(root, step, *args, **kwargs):
    if step == 2:  # Ctrl-C while step 2's checkpoint is being written; the writer then takes its time
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)
    return save(root, step, *args, **kwargs)

ckpt.save_checkpoint = save_after_ctrl_c
from rollforge.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_a_checkpoint_finishes_it_exits_130_and_names_the_step(tiny_config, tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(_INTERRUPTED_RUN)
    config = _config_file(tiny_config, tmp_path, "steps=4", "checkpoint_every=1")
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(script), "train", str(config)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 130, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("rollforge:")]
    assert said == [
        f"rollforge: interrupted; --resume continues after step 2 "
        f"(checkpoint {str(out / 'checkpoints' / 'step-000002')!r})"
    ], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "terminate called" not in done.stderr
    assert _steps(out) == [1, 2] and ckpt.load_newest(out / "checkpoints")[0].step == 2

    resumed = subprocess.run(
        [sys.executable, "-m", "rollforge", "train", str(config), "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _steps(out) == [1, 2, 3, 4]
    assert "step    3/4" in resumed.stderr and "step    2/4" not in resumed.stderr  # continued after step 2
