"""``shapes``: count the circles in three pictures, which only the pictures show.

An environment class in the ``environment_factory`` style that returns images (``produces_images``:
it needs a vision-language backend). The row column ``seed`` draws three panels; each panel is a
48 x 48 picture of a 3 x 3 grid of cells, each cell empty or holding a red circle or a blue square.
The text never says what a panel holds. ``reset`` shows picture 1 with the task (the prompt's
image); ``show(panel)`` returns a panel's picture (a new image each turn); ``answer(count)`` ends
the episode, and ``get_reward()`` is 1.0 when ``count`` is the number of circles in the three
panels, else 0.0 (also 0.0 without an answer). After ``MAX_SHOWS`` pictures shown by the tool
without an answer the episode ends, truncated.

``expert`` looks: it shows the panels it has not seen, in order, then counts the circles in the
pictures the conversation holds (a cell whose centre is coloured holds a shape; a square also
colours the corner of the cell's inner box, a circle does not) and answers the sum. It reads the
images, never the seed, so its demonstrations are what a policy that sees could do.

Pillow draws the pictures (``pip install 'rollforge[vision]'``).
"""

from __future__ import annotations

import random
from typing import Any, Literal, Sequence

from ...chat.toolcalls import ToolCallParser
from ...errors import require
from ...images import as_pil
from ...types import Message, Sample
from ..base import Environment
from ..experts import format_tool_call

PANELS = 3
GRID = 3
CELL = 16
INSET = 3  # the shape's box inside its cell
MAX_SHOWS = 6
_COLOURS = {"circle": (220, 30, 30), "square": (30, 60, 220)}
_BACKGROUND = (255, 255, 255)

SYSTEM_PROMPT = "You are looking at pictures. Call one tool per turn until you answer."
TASK = (
    f"There are {PANELS} pictures, numbered 1 to {PANELS}; here is picture 1. Call show with a picture's "
    "number to see it. Count the red circles in all of them, then call answer with the total."
)


class ShapesEnv:
    """Count the circles in three pictures."""

    def __init__(self) -> None:
        self._panels: list[list[str]] = []
        self._answer: int | None = None
        self._shows = 0
        self.done = False
        self.truncated = False

    def reset(self, seed: int = 0, **_: object) -> list[Any]:
        rng = random.Random(seed)
        self._panels = [[rng.choice(("", "", "circle", "square")) for _ in range(GRID * GRID)] for _ in range(PANELS)]
        self._answer, self._shows, self.done, self.truncated = None, 0, False, False
        return [TASK, draw(self._panels[0])]

    def show(self, panel: Literal[1, 2, 3]) -> list[Any]:
        """Show one picture.

        Args:
            panel: The number of the picture to show: 1, 2 or 3.

        Returns:
            The picture.
        """
        if panel not in range(1, PANELS + 1):
            raise ValueError(f"panel must be 1, 2 or 3, got {panel!r}")
        self._shows += 1
        if self._shows >= MAX_SHOWS:
            self.done = self.truncated = True
        return [f"Picture {panel}:", draw(self._panels[panel - 1])]

    def answer(self, count: int) -> str:
        """Give the number of red circles in all the pictures; this ends the game.

        Args:
            count: The total number of red circles.

        Returns:
            A confirmation.
        """
        self._answer = count
        self.done = True
        return f"You answered {count}."

    def get_reward(self) -> float:
        return 1.0 if self._answer == self.circles() else 0.0

    def circles(self) -> int:
        """The number of circles in the three panels (the answer)."""
        return sum(cell == "circle" for panel in self._panels for cell in panel)


def draw(cells: Sequence[str]) -> Any:
    """A panel's picture: ``cells`` (row by row, "" / "circle" / "square") on a white grid."""
    pil = require("PIL.Image", extra="vision", feature="the shapes environment's pictures")
    draw_module = require("PIL.ImageDraw", extra="vision", feature="the shapes environment's pictures")
    image = pil.new("RGB", (GRID * CELL, GRID * CELL), _BACKGROUND)
    pen = draw_module.Draw(image)
    for k, shape in enumerate(cells):
        if not shape:
            continue
        x, y = (k % GRID) * CELL, (k // GRID) * CELL
        box = (x + INSET, y + INSET, x + CELL - 1 - INSET, y + CELL - 1 - INSET)
        if shape == "circle":
            pen.ellipse(box, fill=_COLOURS["circle"])
        else:
            pen.rectangle(box, fill=_COLOURS["square"])
    return image


def count_circles(image: Any) -> int:
    """The circles in a panel's picture, read from its pixels (see the module docstring)."""
    picture = as_pil(image).convert("RGB")
    found = 0
    for k in range(GRID * GRID):
        x, y = (k % GRID) * CELL, (k // GRID) * CELL
        centre = picture.getpixel((x + CELL // 2, y + CELL // 2))
        corner = picture.getpixel((x + INSET, y + INSET))
        found += centre != _BACKGROUND and corner == _BACKGROUND
    return found


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """Show the next unseen picture (picture 1 came with the task); with all seen, answer the
    circles they hold."""
    pictures = [image for m in messages for image in m.images]
    if any(m.role == "tool" and m.name == "answer" for m in messages):
        return "Done."
    if len(pictures) < PANELS:
        return format_tool_call(parser, "show", {"panel": len(pictures) + 1})
    return format_tool_call(parser, "answer", {"count": sum(count_circles(image) for image in pictures)})


def build() -> Environment:
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(ShapesEnv, produces_images=True)


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = (Message("system", SYSTEM_PROMPT), Message("user", "Let's count shapes."))
        out.append(Sample(prompt=prompt, task_name="shapes", row={"seed": rng.randrange(2**31)}))
    return out
