"""What the soak measures about its own process, and the check of the file it wrote.

Process figures come from Linux's ``/proc/self``: the resident set now (``VmRSS``) and its
high-water mark (``VmHWM``), reset before each chunk by writing ``5`` to ``/proc/self/clear_refs``
(Linux >= 4.0; where that fails the mark only grows and a chunk's peak is an upper bound, said by
``peak_reset``), the threads (``/proc/self/task``, which counts native threads that
``threading.active_count`` does not) and the open file descriptors (``/proc/self/fd``).

``check_partial`` reads the ``.partial`` file back one line at a time (a 100,000-episode file is
hundreds of megabytes; nothing is held but a bitmap of the indices seen and the counts): the file
is whole when it ends in a newline, every line parses as JSON, and every index from 0 to
``episodes - 1`` appears exactly once. Each record's ending is compared with what its episode's
fault must produce (``faults.EXPECTED``); a mismatch counts as ``unexpected_endings``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .faults import EXPECTED, ending_of, kind_of


def status_kb(field: str, pid: int | str = "self") -> int:
    """A ``/proc/PID/status`` figure in kB (``VmRSS``, ``VmHWM``) of this process or ``pid``."""
    with open(f"/proc/{pid}/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


def reset_peak() -> bool:
    """Reset the resident set's high-water mark; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class Sample:
    """The process after one chunk: its peak and final resident set (MB), threads and open fds."""

    peak_rss_mb: float
    rss_mb: float
    threads: int
    python_threads: int
    fds: int


def sample(peak_kb: int) -> Sample:
    """The process now, with ``peak_kb`` as the chunk's high-water mark."""
    return Sample(
        peak_rss_mb=round(peak_kb / 1024, 1),
        rss_mb=round(status_kb("VmRSS") / 1024, 1),
        threads=len(os.listdir("/proc/self/task")),
        python_threads=threading.active_count(),
        fds=len(os.listdir("/proc/self/fd")),
    )


@dataclass(frozen=True)
class PartialCheck:
    """What ``check_partial`` found (see the module docstring)."""

    lines: int
    unparsable_lines: int
    ends_in_newline: bool
    distinct_indices: int
    duplicate_indices: int
    missing_indices: int
    endings: dict[str, int]
    tool_failures: dict[str, int]
    unexpected_endings: int

    @property
    def whole(self) -> bool:
        return self.ends_in_newline and self.unparsable_lines == 0

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "whole": self.whole}


def check_partial(path: Path, episodes: int) -> PartialCheck:
    """Read ``path`` back line by line and account for every episode (see the module docstring)."""
    seen = bytearray(episodes)
    lines = unparsable = duplicates = unexpected = 0
    endings: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    last = b"\n"
    with open(path, "rb") as file:
        for line in file:
            lines, last = lines + 1, line
            try:
                record = json.loads(line)
            except ValueError:
                unparsable += 1
                continue
            index = record["index"]
            if not 0 <= index < episodes or seen[index]:
                duplicates += 1
                continue
            seen[index] = 1
            found = ending_of(record)
            endings[found[1] or found[0]] += 1
            failures.update(found[2])
            unexpected += found != EXPECTED[kind_of(index)]
    distinct = sum(seen)
    return PartialCheck(
        lines=lines,
        unparsable_lines=unparsable,
        ends_in_newline=last.endswith(b"\n"),
        distinct_indices=distinct,
        duplicate_indices=duplicates,
        missing_indices=episodes - distinct,
        endings=dict(sorted(endings.items())),
        tool_failures=dict(sorted(failures.items())),
        unexpected_endings=unexpected,
    )
