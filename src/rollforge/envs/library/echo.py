"""``echo``: the smallest tool environment: call ``echo`` with the requested word.

An environment class in the ``environment_factory`` style. The row column ``word`` is the word the
prompt asks for. The episode ends after the first ``echo`` call (one attempt); the reward is 1.0
when that call's text, stripped and case-folded, equals the word, else 0.0 (also 0.0 when the model
never calls the tool). It exists to test tool-call plumbing end to end, not to be hard.

``expert`` calls ``echo`` with the word the prompt quotes.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from ...chat.toolcalls import ToolCallParser
from ...types import Message, Sample
from ..base import Environment
from ..experts import format_tool_call, last_matching
from .words import WORDS

SYSTEM_PROMPT = "You are a helpful assistant. You can call tools to complete the task."


class EchoEnv:
    """Rewards one ``echo`` call with the requested word."""

    def __init__(self) -> None:
        self._word = ""
        self._echoed: str | None = None
        self.done = False

    def reset(self, word: str, **_: object) -> None:
        self._word = word
        self._echoed = None
        self.done = False
        return None

    def echo(self, text: str) -> str:
        """Repeat the given text back.

        Args:
            text: The text to repeat.

        Returns:
            The same text.
        """
        self._echoed = text
        self.done = True
        return text

    def get_reward(self) -> float:
        if self._echoed is None:
            return 0.0
        return 1.0 if self._echoed.strip().casefold() == self._word.casefold() else 0.0


_REQUEST = "Call the echo tool with the text "
_QUOTED = re.compile(re.escape(_REQUEST) + r'"(.*?)"')


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """Echo the quoted word once; answer without a tool call after the result came back."""
    if any(m.role == "tool" for m in messages):
        return "Done."
    found = _QUOTED.search(last_matching(messages, _REQUEST) or "")
    return format_tool_call(parser, "echo", {"text": found.group(1) if found else ""})


def build() -> Environment:
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(EchoEnv)


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        word = rng.choice(WORDS)
        prompt = (
            Message("system", SYSTEM_PROMPT),
            Message("user", f'{_REQUEST}"{word}".'),
        )
        out.append(Sample(prompt=prompt, task_name="echo", row={"word": word}))
    return out
