"""Writing files whole: every file rollforge replaces is written by ``atomic_write``.

Design: the content goes to ``PATH.tmp`` in the same directory (so the rename never crosses a file
system), is fsynced, then renamed over ``PATH``: a reader sees the old file or the new one, never
half of one. On any failure the temporary file is removed and the error re-raised; an ``OSError``
from the write names ``PATH`` (the file the user knows, not the temporary), and a full disk (ENOSPC,
EDQUOT) reads ``no space left on device``, so the command line can print it as one line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

#: The errnos of a full disk or quota.
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)


def atomic_write(path: Path, data: str | bytes | Callable[[Path], object]) -> Path:
    """Replace ``path`` by ``data`` (text is written as UTF-8) or by what ``data(tmp)`` writes to
    the temporary path it is given; returns ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with space_for(path, also=tmp):
            if callable(data):
                data(tmp)
            elif isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                tmp.write_text(data, encoding="utf-8")
            _fsync(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def space_for(path: Path, also: Path | None = None) -> Iterator[None]:
    """Writes to ``path`` (or to ``also``, its temporary): an ``OSError`` that names no file (or
    names ``also``) is raised again naming ``path``; a full disk reads ``no space left on device``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and (also is None or str(exc.filename) != str(also)):
            raise
        if exc.errno in FULL_DISK:
            raise OSError(exc.errno, "no space left on device", str(path)) from None
        if also is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when there is no such file."""
    return json.loads(path.read_text()) if path.is_file() else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` to ``path`` atomically, indented."""
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
