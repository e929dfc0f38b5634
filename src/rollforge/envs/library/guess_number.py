"""``guess_number``: find a hidden number from "Too high."/"Too low." hints (step-style).

The prompt says "I am thinking of a number between 1 and 20. Reply with a single number."; each
reply is read as the last integer in it. The observation is "Too high.", "Too low." or "Correct!".
A reply without a number, or with one outside the range, gets a reminder and still uses a guess,
so every episode ends. The reward is 1.0 on the turn the number is found (flat, not decaying:
binary search may need 5 guesses for 20 numbers, and a flat reward keeps the mean reward equal to
the solve rate); after ``max_guesses`` wrong guesses (6 by default) the episode terminates with
reward 0.0 and the number is revealed. The environment is stateless: the target, range and guess
count live in each sample's metadata, which each step returns updated.

``expert`` plays binary search on the hints so far: at most 5 guesses for 1-20.
"""

from __future__ import annotations

import random
import re
from typing import Any, Sequence

from ...chat.toolcalls import ToolCallParser
from ...types import Message, Sample
from ..base import Environment
from ..stepwise import StepwiseEnvironment, StepwiseReturn

LOW, HIGH = 1, 20
MAX_GUESSES = 6

_INTEGER = re.compile(r"(?<!\d)-?\d+")


def prompt_text(low: int = LOW, high: int = HIGH) -> str:
    return f"I am thinking of a number between {low} and {high}. Reply with a single number."


class GuessNumberEnv:
    """Answers each guess with a hint; metadata: ``target``, ``low``, ``high``, ``max_guesses``,
    ``guesses`` (the number made so far, 0 when absent)."""

    def step(self, message_logs: list[list[dict]], metadata: list[Any]) -> StepwiseReturn:
        observations, new_metadata, rewards, terminateds = [], [], [], []
        for log, info in zip(message_logs, metadata):
            reply = next((m["content"] for m in reversed(log) if m["role"] == "assistant"), "")
            text, reward, terminated, info = self._judge(reply, info)
            observations.append({"role": "user", "content": text})
            new_metadata.append(info)
            rewards.append(reward)
            terminateds.append(terminated)
        return StepwiseReturn(
            observations=observations,
            metadata=new_metadata,
            next_stop_strings=[None] * len(message_logs),
            rewards=rewards,
            terminateds=terminateds,
        )

    @staticmethod
    def _judge(reply: str, info: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        target = int(info["target"])
        low, high = int(info.get("low", LOW)), int(info.get("high", HIGH))
        max_guesses = int(info.get("max_guesses", MAX_GUESSES))
        guesses = int(info.get("guesses", 0)) + 1
        info = {**info, "guesses": guesses}
        numbers = _INTEGER.findall(reply)
        if numbers and int(numbers[-1]) == target:
            return "Correct!", 1.0, True, info
        if not numbers:
            text = f"Please reply with a single number between {low} and {high}."
        elif not low <= int(numbers[-1]) <= high:
            text = f"{numbers[-1]} is not between {low} and {high}."
        else:
            text = "Too high." if int(numbers[-1]) > target else "Too low."
        if guesses >= max_guesses:
            return f"{text} Out of guesses: the number was {target}.", 0.0, True, info
        return text, 0.0, False, info


_RANGE = re.compile(r"between (-?\d+) and (-?\d+)")


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """The middle of the range the hints so far leave open (no tool: replies are plain numbers)."""
    opening = next((m.content for m in messages if m.role == "user"), "")
    found = _RANGE.search(opening)
    low, high = (int(found.group(1)), int(found.group(2))) if found else (LOW, HIGH)
    for reply, hint in zip(messages, messages[1:]):
        numbers = _INTEGER.findall(reply.content) if reply.role == "assistant" else []
        if numbers and hint.content.startswith("Too high."):
            high = min(high, int(numbers[-1]) - 1)
        elif numbers and hint.content.startswith("Too low."):
            low = max(low, int(numbers[-1]) + 1)
    return str((low + high) // 2)


def build() -> Environment:
    return StepwiseEnvironment(GuessNumberEnv(), run_in_thread=False)


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randint(LOW, HIGH)
        metadata = {"target": target, "low": LOW, "high": HIGH, "max_guesses": MAX_GUESSES}
        prompt = (Message("user", prompt_text()),)
        out.append(Sample(prompt=prompt, task_name="guess_number", row={"metadata": metadata}))
    return out
