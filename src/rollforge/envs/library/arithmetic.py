"""``arithmetic``: single-turn addition, a step-style environment.

The prompt asks "What is 3 + 4? Answer with just the number."; the metadata holds the operands and
the expected ``answer``. The reward is 1.0 when the *last* number in the model's answer equals the
result (so "3 + 4 = 7" counts), else 0.0, including answers with no number at all. Every episode
terminates after its one step, with no observation message. Operands have ``digits`` digits
(one by default: 0-9, the level a 135M-parameter model sometimes solves).
"""

from __future__ import annotations

import random
import re
from typing import Any

from ...errors import ConfigError
from ...types import Message, Sample
from ..base import Environment
from ..stepwise import StepwiseEnvironment, StepwiseReturn

_NUMBER = re.compile(r"(?<!\d)-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` ("1,024" and "7.0" included), or None."""
    matches = _NUMBER.findall(text)
    return float(matches[-1].replace(",", "")) if matches else None


def score_answer(text: str, answer: int) -> float:
    """1.0 when the last number in ``text`` equals ``answer``, else 0.0."""
    number = last_number(text)
    return 1.0 if number is not None and number == answer else 0.0


class ArithmeticEnv:
    """Scores each sample's last assistant message against ``metadata["answer"]``."""

    def step(self, message_logs: list[list[dict]], metadata: list[Any]) -> StepwiseReturn:
        rewards = []
        for log, info in zip(message_logs, metadata):
            reply = next((m["content"] for m in reversed(log) if m["role"] == "assistant"), "")
            rewards.append(score_answer(reply, int(info["answer"])))
        return StepwiseReturn.final(rewards, list(metadata))


def build() -> Environment:
    return StepwiseEnvironment(ArithmeticEnv(), run_in_thread=False)


def samples(n: int, seed: int, *, digits: int = 1) -> list[Sample]:
    """``n`` addition problems whose operands have ``digits`` digits (0-9 for one digit)."""
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
        raise ConfigError(f"arithmetic digits must be a positive int, got {digits!r}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(low, high), rng.randint(low, high)
        prompt = (Message("user", f"What is {a} + {b}? Answer with just the number."),)
        metadata = {"a": a, "b": b, "answer": a + b}
        out.append(Sample(prompt=prompt, task_name="arithmetic", row={"metadata": metadata}))
    return out
