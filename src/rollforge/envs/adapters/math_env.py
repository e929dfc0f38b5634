"""Math answers verified with math-verify, as a single-turn step-style environment.

Each sample's metadata holds the gold answer (LaTeX or plain, ``{"answer": "\\frac{1}{2}"}``), so
any dataset of question/answer rows works; ``math_problems.py`` generates the bundled ones. The
reply is parsed by math-verify (``\\boxed{}`` first, then the last expression) and compared with
the gold answer symbolically: ``0.5``, ``\\frac{1}{2}`` and ``1/2`` all match ``\\frac12``. The
step terminates with reward 1.0 or 0.0 and no observation; the metadata records ``verdict``.

Timeouts: math-verify bounds its parsing and verification with ``signal.alarm``, which raises on
any thread but the main one (the engine steps environments in worker threads) and would deliver
SIGALRM into the host process. So its timeouts are switched off and verification runs in a worker
process (``_math_worker.py``, started on first use) that rollforge bounds itself: a request that
takes longer than ``timeout`` seconds kills the worker, scores 0.0 with the verdict
``"timeout"`` and the next request starts a fresh worker. A sympy expression that never finishes
simplifying therefore costs one worker, never a hung thread.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time
from typing import Any

from ...errors import ConfigError, require
from ...types import Sample
from ..stepwise import StepwiseEnvironment, StepwiseReturn

EXTRA = "math"
DEFAULT_TIMEOUT = 10.0


class VerifyWorker:
    """A math-verify process answering one request at a time, bounded by ``timeout`` seconds."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"the verification timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._process: subprocess.Popen | None = None
        self._buffer = b""
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """A copy (shipped to an environment actor) starts its own worker process."""
        return {"timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["timeout"])

    def _start(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "rollforge.envs.adapters._math_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            self._buffer = b""
        return self._process

    def verify(self, gold: str, answer: str, *, first_start_grace: float = 30.0) -> tuple[bool, str]:
        """(correct, verdict): verdict is ``"correct"``, ``"wrong"``, ``"timeout"`` or an error."""
        with self._lock:
            fresh = self._process is None or self._process.poll() is not None
            process = self._start()
            budget = self.timeout + (first_start_grace if fresh else 0.0)  # the first import is slow
            try:
                process.stdin.write((json.dumps({"gold": gold, "answer": answer}) + "\n").encode())
                process.stdin.flush()
                line = self._read_line(process, time.monotonic() + budget)
            except (BrokenPipeError, OSError) as exc:
                self.close_locked()
                return False, f"error: the verifier process failed: {exc}"
            if line is None:
                self.close_locked()
                return False, "timeout"
            reply = json.loads(line)
            if "error" in reply:
                return False, f"error: {reply['error']}"
            return bool(reply["correct"]), "correct" if reply["correct"] else "wrong"

    def _read_line(self, process: subprocess.Popen, deadline: float) -> bytes | None:
        fd = process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise OSError("the verifier process exited")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def close_locked(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for pipe in (self._process.stdin, self._process.stdout):
                pipe.close()
            self._process = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def __del__(self) -> None:
        process = getattr(self, "_process", None)  # absent when __init__ raised
        if process is not None and process.poll() is None:
            process.kill()


class MathVerifyEnv:
    """Scores each sample's last assistant message against ``metadata["answer"]``."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT):
        require("math_verify", EXTRA, "the math environment")
        self.worker = VerifyWorker(timeout)

    def step(self, message_logs: list[list[dict]], metadata: list[Any]) -> StepwiseReturn:
        rewards, new_metadata = [], []
        for log, info in zip(message_logs, metadata):
            reply = next((m["content"] for m in reversed(log) if m["role"] == "assistant"), "")
            gold = str(info["answer"])
            correct, verdict = self.worker.verify(gold if "$" in gold or "\\boxed" in gold else f"${gold}$", reply)
            rewards.append(1.0 if correct else 0.0)
            new_metadata.append({**info, "verdict": verdict})
        return StepwiseReturn.final(rewards, new_metadata)


def build() -> StepwiseEnvironment:
    return StepwiseEnvironment(MathVerifyEnv())


def samples(n: int, seed: int) -> list[Sample]:
    from .math_problems import samples as generate

    return generate(n, seed)
