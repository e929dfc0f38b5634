"""``calculator``: three-digit arithmetic through tools, where choosing the right tool is learned.

An environment class in the ``environment_factory`` style. The prompt asks "What is 347 times
29?" (``plus``, ``minus`` or ``times``, operands of ``digits`` digits, three by default: past what
a small model computes in its head). The tools are ``add``, ``subtract`` and ``multiply``, each
returning ``a <op> b``. The first call ends the episode (one attempt, as in ``echo``); the reward
is 1.0 when the value it returned equals the question's result, else 0.0 (also 0.0 when the model
answers without a call). The row columns are ``a``, ``b``, ``op`` and ``result``.

The call format and copying the operands are easy to demonstrate; which tool a question needs is
the strategy, and that is what reinforcement learning is left to find.

``expert`` is a format teacher, not a strategy teacher: it calls one of the three tools, chosen at
random (seeded by the question, so demonstrations are reproducible), with the question's operands.
It solves a third of its episodes; a warm-up on all its demonstrations (``min_reward: null``)
learns the call format but not which tool a question needs.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from ...chat.toolcalls import ToolCallParser
from ...errors import ConfigError
from ...types import Message, Sample
from ..base import Environment
from ..experts import format_tool_call

SYSTEM_PROMPT = "Compute the answer with one calculator tool call."

#: The question's word for each operation, and the tool that computes it.
OPERATIONS = {"plus": "add", "minus": "subtract", "times": "multiply"}
_APPLY = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b}
_QUESTION = re.compile(r"What is (\d+) (plus|minus|times) (\d+)\?")


class CalculatorEnv:
    """Three operation tools; the first call ends the episode, rewarded when it gives the result."""

    def __init__(self) -> None:
        self._result = 0
        self._computed: int | None = None
        self.done = False

    def reset(self, result: int, **_: object) -> None:
        self._result = int(result)
        self._computed = None
        self.done = False
        return None

    def add(self, a: int, b: int) -> str:
        """Return a + b."""
        return self._compute(a + b)

    def subtract(self, a: int, b: int) -> str:
        """Return a - b."""
        return self._compute(a - b)

    def multiply(self, a: int, b: int) -> str:
        """Return a * b."""
        return self._compute(a * b)

    def _compute(self, value: int) -> str:
        self._computed = value
        self.done = True
        return str(value)

    def get_reward(self) -> float:
        return 1.0 if self._computed == self._result else 0.0


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """A random operation tool on the question's operands (the episode ends with that call)."""
    if any(m.role == "tool" for m in messages):
        return "Done."
    question = next((m.content for m in reversed(messages) if m.role == "user"), "")
    found = _QUESTION.search(question)
    if found is None:
        return "I cannot read the question."
    tool = random.Random(found.group()).choice(sorted(_APPLY))
    return format_tool_call(parser, tool, {"a": int(found.group(1)), "b": int(found.group(3))})


def build() -> Environment:
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(CalculatorEnv)


def samples(n: int, seed: int, *, digits: int = 3) -> list[Sample]:
    """``n`` questions, the operation uniform over plus/minus/times, operands of ``digits`` digits."""
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
        raise ConfigError(f"calculator digits must be a positive int, got {digits!r}")
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        word = rng.choice(sorted(OPERATIONS))
        a, b = rng.randint(low, high), rng.randint(low, high)
        prompt = (Message("system", SYSTEM_PROMPT), Message("user", f"What is {a} {word} {b}?"))
        row = {"a": a, "b": b, "op": word, "result": _APPLY[OPERATIONS[word]](a, b)}
        out.append(Sample(prompt=prompt, task_name="calculator", row=row))
    return out
