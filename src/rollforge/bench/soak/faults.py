"""The soak's environments: one ``environment_factory`` class per injected fault, and the ending
each must produce.

Every episode asks for one tool call (the scripted backend always writes ``work``); what the
environment does with it decides the episode's ending, known in advance (``EXPECTED``):

- ``normal``: ``work`` answers and ends the task (``terminated``);
- ``raising``: ``work`` raises on its first call (a ``tool_raised`` failure reported to the model),
  answers on the second (``terminated``, one counted failure);
- ``broken``: ``reset`` raises (an ``env_error``, an infrastructure failure);
- ``hanging``: ``work`` blocks its worker thread for ``hang_seconds``, past the step timeout (an
  ``env_timeout``; the thread is abandoned and ends on its own later);
- ``slow``: ``work`` blocks for ``slow_seconds``, well inside the step timeout (``terminated``);
- ``huge``: ``work`` returns ``huge_chars`` characters, far more than ``max_seq_len`` holds (the
  engine cuts the observation: ``truncated``).

Sync tools run on rollforge's worker threads, as a user's plain ``def`` tools do, so hung and slow
calls exercise the thread pool. ``KINDS`` is the deterministic mix: episode ``i`` is
``KINDS[i % len(KINDS)]`` (half normal, a tenth of each fault).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

from ...envs.factory import FactoryEnvironment

#: One period of the mix: episode ``i`` runs ``KINDS[i % len(KINDS)]``.
KINDS = ("normal",) * 5 + ("raising", "broken", "hanging", "slow", "huge")

#: kind -> (ending, error kind or None, counted tool failures of each episode)
EXPECTED: Mapping[str, tuple[str, str | None, tuple[str, ...]]] = {
    "normal": ("terminated", None, ()),
    "raising": ("terminated", None, ("tool_raised",)),
    "broken": ("error", "env_error", ()),
    "hanging": ("error", "env_timeout", ()),
    "slow": ("terminated", None, ()),
    "huge": ("truncated", None, ()),
}

#: A huge observation's text: varied words, as a real dump would be, not one repeated character.
_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda")


class Normal:
    """Answers once and ends the task."""

    def reset(self, **row: Any) -> str:
        self.done = False
        return "Call work once."

    def work(self) -> str:
        """Do the work."""
        self.done = True
        return "done"


class Raising(Normal):
    """Its tool raises on the first call."""

    def reset(self, **row: Any) -> str:
        self.calls = 0
        return super().reset()

    def work(self) -> str:
        """Do the work."""
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("injected: the tool failed")
        return super().work()


class Broken(Normal):
    """Its reset raises."""

    def reset(self, **row: Any) -> str:
        raise RuntimeError("injected: the environment failed to start")


class Sleeping(Normal):
    """Its tool blocks its thread for ``seconds`` (past the step timeout: hanging; within it: slow)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def work(self) -> str:
        """Do the work."""
        time.sleep(self.seconds)
        return super().work()


class Huge(Normal):
    """Its tool returns ``chars`` characters."""

    def __init__(self, chars: int):
        self.chars = chars

    def work(self) -> str:
        """Do the work."""
        super().work()
        words = " ".join(f"{_WORDS[i % len(_WORDS)]}{i}" for i in range(self.chars // 6 + 1))
        return words[: self.chars]


def environments(hang_seconds: float, slow_seconds: float, huge_chars: int) -> dict[str, FactoryEnvironment]:
    """One environment per kind, keyed by the kind (the samples' ``task_name``)."""
    return {
        "normal": FactoryEnvironment(Normal),
        "raising": FactoryEnvironment(Raising),
        "broken": FactoryEnvironment(Broken),
        "hanging": FactoryEnvironment(functools.partial(Sleeping, hang_seconds)),
        "slow": FactoryEnvironment(functools.partial(Sleeping, slow_seconds)),
        "huge": FactoryEnvironment(functools.partial(Huge, huge_chars)),
    }


def kind_of(index: int) -> str:
    """The fault episode ``index`` runs."""
    return KINDS[index % len(KINDS)]


def ending_of(record: Mapping[str, Any]) -> tuple[str, str | None, tuple[str, ...]]:
    """A written trajectory record's (ending, error kind, tool failure kinds), as ``EXPECTED`` has them."""
    error = record.get("error")
    if error:
        ending = "error"
    else:
        ending = next((name for name in ("terminated", "truncated", "max_turns_reached") if record.get(name)), "none")
    return ending, error["kind"] if error else None, tuple(f["kind"] for f in record.get("failures", ()))
