"""``wordle``: guess a secret five-letter word in six guesses, a multi-turn tool game.

An environment class in the ``environment_factory`` style. The row column ``target`` is the secret
word. Each ``guess`` answers with one symbol per letter: ``G`` right letter in the right spot, ``Y``
in the word but elsewhere, ``_`` not in the word (repeated letters are scored the standard way: a
letter is marked ``G``/``Y`` at most as many times as it occurs in the target, greens first).

Invalid guesses (not five letters, or not in the embedded word list) get an error message and do
*not* use up one of the six guesses: the model is told what was wrong and tries again; the
engine's turn limit bounds how long it can keep failing. The game is ``done`` when the word is
found or six valid guesses are used.

Reward (``get_reward``): 1.0 when solved. Otherwise partial credit from the last valid guess,
``(greens + 0.5 * yellows) / 10``, which is below 0.5, so any solve beats any miss; 0.0 when no
valid guess was made.

``expert`` keeps the words consistent with every result so far and guesses the one that splits
them into the most distinct results (ties: word-list order).
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from typing import Sequence

from ...chat.toolcalls import ToolCallParser
from ...types import Message, Sample
from ..base import Environment
from ..experts import format_tool_call
from .words import WORD_SET, WORDS

MAX_GUESSES = 6
LEGEND = "(G: right letter, right spot. Y: in the word, wrong spot. _: not in the word.)"

SYSTEM_PROMPT = "You are playing Wordle. Call the guess tool with one five-letter word per turn."


def score_guess(guess: str, target: str) -> str:
    """Per-letter feedback for ``guess`` against ``target``: a string of ``G``, ``Y`` and ``_``.

    Greens are assigned first; each target letter left unmatched can then justify one ``Y``,
    left to right. So ``score_guess("speed", "abide") == "__Y_Y"``: "abide" has one ``e``, which
    marks the first ``e`` of "speed" and leaves the second one ``_``.
    """
    if len(guess) != len(target):
        raise ValueError(f"guess {guess!r} and target {target!r} differ in length")
    marks = ["_"] * len(guess)
    unmatched: Counter[str] = Counter()
    for i, (g, t) in enumerate(zip(guess, target)):
        if g == t:
            marks[i] = "G"
        else:
            unmatched[t] += 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and unmatched[g] > 0:
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


class WordleEnv:
    """Find the secret five-letter word."""

    def __init__(self) -> None:
        self._target = ""
        self._used = 0
        self._last_marks: str | None = None
        self.done = False

    def reset(self, target: str, **_: object) -> str:
        target = target.strip().lower()
        if len(target) != 5 or not target.isalpha():
            raise ValueError(f"wordle target must be a five-letter word, got {target!r}")
        self._target = target
        self._used = 0
        self._last_marks = None
        self.done = False
        return (
            f"Rules: find the secret five-letter word in {MAX_GUESSES} guesses. Call guess with "
            f"a common English five-letter word. After each guess you get one symbol per letter. "
            f"{LEGEND}"
        )

    def guess(self, word: str) -> str:
        """Guess the secret word.

        Args:
            word: A common five-letter English word, for example "crane".

        Returns:
            One symbol per letter (G, Y or _), or why the guess was not accepted.
        """
        if self.done:
            return "The game is over."
        word = word.strip().lower()
        left = MAX_GUESSES - self._used
        if len(word) != 5 or not word.isalpha():
            return (
                f"Invalid guess {word!r}: a guess must be exactly five letters. This did not use a guess; {left} left."
            )
        if word not in WORD_SET:
            return (
                f"{word!r} is not in the word list; try a common English word. This did not use a guess; {left} left."
            )
        self._used += 1
        marks = score_guess(word, self._target)
        self._last_marks = marks
        lines = [
            f"Guess {self._used} of {MAX_GUESSES}: {' '.join(word.upper())}",
            f"Result:       {' '.join(marks)}",
            LEGEND,
        ]
        if marks == "G" * 5:
            self.done = True
            lines.append("You found the word!")
        elif self._used == MAX_GUESSES:
            self.done = True
            lines.append(f"Out of guesses. The word was {self._target!r}.")
        else:
            left = MAX_GUESSES - self._used
            lines.append(f"{left} guess left." if left == 1 else f"{left} guesses left.")
        return "\n".join(lines)

    def get_reward(self) -> float:
        if self._last_marks is None:
            return 0.0
        if self._last_marks == "G" * 5:
            return 1.0
        return (self._last_marks.count("G") + 0.5 * self._last_marks.count("Y")) / 10


_RESULT = re.compile(r"Guess \d+ of \d+: ([A-Z ]+)\nResult: +([GY_ ]+)")


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """Guess the word that best splits the candidates left by the results in tool messages."""
    history = tuple(
        (found.group(1).replace(" ", "").lower(), found.group(2).replace(" ", ""))
        for m in messages
        if m.role == "tool" and (found := _RESULT.search(m.content))
    )
    if history and history[-1][1] == "G" * 5:
        return "I found the word."
    return format_tool_call(parser, "guess", {"word": _best_guess(history)})


#: ``_best_guess(())``, precomputed (3 s of scoring; a test checks it).
OPENER = "trace"


@functools.lru_cache(maxsize=4096)
def _best_guess(history: tuple[tuple[str, str], ...], opener: str | None = OPENER) -> str:
    if not history and opener is not None:
        return opener
    candidates = [w for w in WORDS if all(score_guess(g, w) == marks for g, marks in history)] or list(WORDS)
    if len(candidates) <= 2:
        return candidates[0]
    return max(candidates, key=lambda g: len({score_guess(g, w) for w in candidates}))


def build() -> Environment:
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(WordleEnv)


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = (
            Message("system", SYSTEM_PROMPT),
            Message("user", "Let's play Wordle. Guess the secret five-letter word."),
        )
        out.append(Sample(prompt=prompt, task_name="wordle", row={"target": rng.choice(WORDS)}))
    return out
