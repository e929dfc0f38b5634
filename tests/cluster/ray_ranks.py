"""Stand-ins for training ranks that the rank-watch tests run on Ray actors, each call doing one
thing a rank can do: return, block in a collective whose peer never comes, die, refuse, fail. Kept
apart from the test module so that an actor imports this small module, not the tests' imports."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rollforge.errors import ConfigError
from rollforge.testing import HANG_SECONDS, wait_until


class Rank:
    def result(self, value: str) -> str:
        return value

    def block(self) -> None:
        threading.Event().wait()  # a gloo collective whose peer is gone and no timeout came yet

    def exit(self) -> None:
        os._exit(1)  # the process is gone, as when its node's raylet and workers are killed

    def refuse(self) -> None:
        raise ConfigError("algorithm.batch_size=3 must be a multiple of the 2 ranks")

    def fail(self) -> None:
        raise ValueError("a bug in the rank")

    def fail_announcing(self, path: str) -> None:
        """Fail as a collective fails when its peer's sockets close, and say so in ``path``."""
        Path(path).write_text("failed")
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")

    def exit_after(self, path: str) -> None:
        """Die once ``path`` exists (the peer's collective failed first)."""
        assert wait_until(lambda: Path(path).exists(), timeout=HANG_SECONDS, interval=0.01)
        os._exit(1)
