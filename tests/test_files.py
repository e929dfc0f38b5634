"""``atomic_write``: the old file or the new one, never half of one; a failure names the file."""

import errno

import pytest

from rollforge.files import atomic_write


def test_text_bytes_and_a_writer_replace_the_file_whole(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    assert atomic_write(path, "new ✓") == path and path.read_text(encoding="utf-8") == "new ✓"
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    atomic_write(path, lambda tmp: tmp.write_text("written by the writer"))
    assert path.read_text() == "written by the writer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_full_disk_keeps_the_old_file_and_names_the_path(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text("old")
    (tmp_path / "metrics.json.tmp").symlink_to("/dev/full")  # every write: ENOSPC
    with pytest.raises(OSError) as caught:
        atomic_write(path, "new")
    assert caught.value.errno == errno.ENOSPC
    assert str(caught.value) == f"[Errno {errno.ENOSPC}] no space left on device: {str(path)!r}"
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_a_failing_writer_removes_the_temporary_and_reraises(tmp_path):
    path = tmp_path / "model.safetensors"

    def half_then_interrupted(tmp):
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, half_then_interrupted)
    assert list(tmp_path.iterdir()) == []


def test_an_error_naming_another_file_is_left_alone(tmp_path):
    def reads_a_missing_file(tmp):
        (tmp_path / "missing").read_text()

    with pytest.raises(FileNotFoundError) as caught:
        atomic_write(tmp_path / "out", reads_a_missing_file)
    assert caught.value.filename == str(tmp_path / "missing")
