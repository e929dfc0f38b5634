"""The ``rollforge`` command's answer to faults of the machine (a full disk, a read-only file
system) and to Ctrl-C: one line naming the file, a non-zero exit status, no traceback."""

from __future__ import annotations

import errno
import subprocess

import pytest

from rollforge.cli import main as cli_main
from rollforge.cli import train as cli_train
from rollforge.cli.main import main
from rollforge.cli.rollout_results import PartialWriter, read_partial


def _rollforge_lines(err: str) -> list[str]:
    """stderr without the progress bar."""
    return [line for line in err.splitlines() if line.startswith("rollforge:") or "Traceback" in line]


def _rollout(model, out) -> int:
    return main(
        [
            "rollout",
            "--model",
            str(model),
            "--env",
            "arithmetic",
            "--episodes",
            "12",
            "--max-new-tokens",
            "8",
            "--concurrency",
            "2",
            "--out",
            str(out),
        ]
    )


def test_a_full_disk_during_rollout_is_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    real_append = PartialWriter.append
    appended = []

    def full_after_two(self, record):
        if len(appended) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real_append(self, record)
        appended.append(record)

    monkeypatch.setattr(PartialWriter, "append", full_after_two)
    out = tmp_path / "run"
    assert _rollout(tiny_model_dir, out) == 1
    assert _rollforge_lines(capsys.readouterr().err) == [
        f"rollforge: error: {out}/trajectories.jsonl.partial: no space left on device"
    ]
    assert len(read_partial(out / "trajectories.jsonl.partial")) == 2
    assert not (out / "trajectories.jsonl").exists()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 8 KiB file system (needs root and a kernel that lets this process mount)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(mount)], capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)


def test_a_really_full_disk_during_rollout_is_one_line(tiny_model_dir, small_tmpfs, capsys):
    out = small_tmpfs / "run"
    assert _rollout(tiny_model_dir, out) == 1
    assert _rollforge_lines(capsys.readouterr().err) == [
        f"rollforge: error: {out}/trajectories.jsonl.partial: no space left on device"
    ]
    partial = out / "trajectories.jsonl.partial"
    assert 0 < len(read_partial(partial)) < 12 and partial.read_bytes().endswith(b"\n")
    assert sorted(p.name for p in out.iterdir()) == ["trajectories.jsonl.partial"]


@pytest.mark.parametrize(
    "code, reason",
    [
        (errno.EROFS, "read-only file system"),
        (errno.EDQUOT, "disk quota exceeded"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_a_machine_fault_in_train_is_one_line(monkeypatch, tmp_path, capsys, code, reason):
    path = tmp_path / "run" / "checkpoints" / "step-2"

    def fails(args):
        raise OSError(code, "strerror as the OS says it", str(path))

    monkeypatch.setattr(cli_train, "_train", fails)
    assert main(["train", str(tmp_path / "config.yaml")]) == 1
    assert capsys.readouterr().err == f"rollforge: error: {path}: strerror as the os says it\n"
    assert cli_main.describe_fault(OSError(code, None)) == reason


def test_other_os_errors_are_not_taken_for_the_machines(monkeypatch, tmp_path):
    def fails(args):
        raise OSError(errno.EBADF, "Bad file descriptor")  # a bug: its traceback is wanted

    monkeypatch.setattr(cli_train, "_train", fails)
    with pytest.raises(OSError, match="Bad file descriptor"):
        main(["train", str(tmp_path / "config.yaml")])


def test_ctrl_c_is_one_line_and_status_130(monkeypatch, tmp_path, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_train, "_train", interrupted)
    assert main(["train", str(tmp_path / "config.yaml")]) == 130
    assert capsys.readouterr().err == "rollforge: interrupted\n"
