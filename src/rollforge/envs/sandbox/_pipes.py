"""Read a child's pipes with byte caps and a deadline, killing its process group when either is hit.

One ``selectors`` loop over every pipe: data beyond a cap is read and dropped (so the writer never
blocks on a full pipe while we wait for it), and the first cap or deadline breach kills the child's
process group with SIGKILL. The loop ends when every pipe reached end-of-file, which happens once
every process holding a write end is gone, then the child is reaped. After a kill, the pipes get a
short grace period to drain; should a write end still be open after it (it cannot be, once the
jail's PID namespace is gone), the loop stops anyway: nothing here waits without a bound.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Mapping

_CHUNK = 1 << 16
_GRACE_SECONDS = 3.0


@dataclass
class Streams:
    """What was read: bytes per pipe name, and why reading stopped early (None: it did not)."""

    data: dict[str, bytes] = field(default_factory=dict)
    stopped: str | None = None


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_capped(
    process: subprocess.Popen,
    fds: Mapping[str, int],
    *,
    caps: Mapping[str, int],
    shared_cap: tuple[str, str, int],
    deadline: float,
) -> Streams:
    """Read ``fds`` (name -> fd, closed here) until EOF; ``shared_cap`` bounds two pipes together."""
    streams = Streams(data={name: b"" for name in fds})
    chunks: dict[str, list[bytes]] = {name: [] for name in fds}
    sizes = dict.fromkeys(fds, 0)
    first, second, shared = shared_cap
    selector = selectors.DefaultSelector()
    for name, fd in fds.items():
        selector.register(fd, selectors.EVENT_READ, name)
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if streams.stopped is not None:
                    break  # grace period over
                streams.stopped = "timeout"
                kill_group(process)
                deadline = time.monotonic() + _GRACE_SECONDS
                continue
            for key, _ in selector.select(timeout=remaining):
                name = key.data
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(key.fd)
                    continue
                room = caps[name] - sizes[name]
                if name in (first, second):
                    room = min(room, shared - sizes[first] - sizes[second])
                if room > 0:
                    chunks[name].append(data[:room])
                    sizes[name] += min(room, len(data))
                if len(data) > room and streams.stopped is None:
                    streams.stopped = "output_limit"
                    kill_group(process)
                    deadline = time.monotonic() + _GRACE_SECONDS
    finally:
        for fd in list(selector.get_map()):
            selector.unregister(fd)
        selector.close()
        for name, fd in fds.items():
            if name not in ("stdout", "stderr"):  # those belong to the Popen object
                os.close(fd)
        try:
            process.wait(timeout=_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    streams.data = {name: b"".join(parts) for name, parts in chunks.items()}
    return streams
