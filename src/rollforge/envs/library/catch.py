"""``catch``: a multi-turn tool game: move the paddle under a falling ball.

An environment class in the ``environment_factory`` style. The board is 5 columns by 5 rows; the
ball starts on the top row and falls one row per ``move``; the paddle sits on the bottom row. After
4 moves the ball reaches the bottom row and the game is ``done``; ``get_reward()`` is 1.0 when the
paddle is under the ball then, else 0.0. The row column ``seed`` places ball and paddle, so an
episode is deterministic given its row; every start can be caught (the paddle is never more than
4 columns away). Moving into a wall leaves the paddle where it is. Columns are numbered 1-5 in the
text so that a small model can compare positions without reading the grid.

``expert`` moves the paddle toward the ball's column (the ball falls straight down), which catches
every ball.
"""

from __future__ import annotations

import random
import re
from typing import Literal, Sequence

from ...chat.toolcalls import ToolCallParser
from ...types import Message, Sample
from ..base import Environment
from ..experts import format_tool_call, last_matching

WIDTH = 5
HEIGHT = 5
_SHIFT = {"left": -1, "right": 1, "stay": 0}

SYSTEM_PROMPT = "You are playing a game. Call the move tool once per turn until the game ends."


class CatchEnv:
    """Catch the falling ball with the paddle."""

    def __init__(self) -> None:
        self._ball_row = 0
        self._ball_col = 0
        self._paddle_col = 0
        self.done = False

    def reset(self, seed: int = 0, **_: object) -> str:
        rng = random.Random(seed)
        self._ball_row = 0
        self._ball_col = rng.randrange(WIDTH)
        self._paddle_col = rng.randrange(WIDTH)
        self.done = False
        rules = (
            f"Rules: a ball (o) falls one row each move on a {WIDTH}x{HEIGHT} board. Your paddle "
            f"(P) is on the bottom row. Call move with left, right or stay so that the paddle is "
            f"under the ball when it reaches the bottom."
        )
        return f"{rules}\n\n{self._render()}\n{self._status()}"

    def move(self, direction: Literal["left", "right", "stay"]) -> str:
        """Move the paddle one column, then the ball falls one row.

        Args:
            direction: Where to move the paddle: "left", "right" or "stay".

        Returns:
            The new board and the positions of ball and paddle.
        """
        if self.done:
            return "The game is over."
        if direction not in _SHIFT:
            raise ValueError(f"direction must be one of {sorted(_SHIFT)}, got {direction!r}")
        self._paddle_col = min(WIDTH - 1, max(0, self._paddle_col + _SHIFT[direction]))
        self._ball_row += 1
        if self._ball_row == HEIGHT - 1:
            self.done = True
        return f"{self._render()}\n{self._status()}"

    def get_reward(self) -> float:
        return 1.0 if self._caught() else 0.0

    def _caught(self) -> bool:
        return self.done and self._ball_col == self._paddle_col

    def _render(self) -> str:
        rows = []
        for row in range(HEIGHT):
            cells = ["."] * WIDTH
            if row == HEIGHT - 1:
                cells[self._paddle_col] = "P"
            if row == self._ball_row and not self._caught():
                cells[self._ball_col] = "o"
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def _status(self) -> str:
        if self.done:
            return "The ball reached the bottom: " + ("you caught it!" if self._caught() else "you missed it.")
        moves_left = HEIGHT - 1 - self._ball_row
        return (
            f"Ball: column {self._ball_col + 1}, row {self._ball_row + 1} of {HEIGHT}. "
            f"Paddle: column {self._paddle_col + 1}. Moves left: {moves_left}."
        )


_POSITIONS = re.compile(r"Ball: column (\d+), .*?Paddle: column (\d+)\.")


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """Move toward the ball's column, read from the last status line."""
    status = last_matching(messages, "Ball: column")
    found = _POSITIONS.search(status or "")
    if found is None:
        return "The game is over."
    ball, paddle = int(found.group(1)), int(found.group(2))
    direction = "right" if ball > paddle else "left" if ball < paddle else "stay"
    return format_tool_call(parser, "move", {"direction": direction})


def build() -> Environment:
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(CatchEnv)


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = (Message("system", SYSTEM_PROMPT), Message("user", "Let's play Catch."))
        out.append(Sample(prompt=prompt, task_name="catch", row={"seed": rng.randrange(2**31)}))
    return out
