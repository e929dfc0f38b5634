"""Bundled environments, by name: ``get_env_spec("catch").build()`` and ``.samples(n, seed)``.

Each environment lives in its own module with its prompts and sample generator; this registry
only names them. Importing it is light (no torch, no tokenizer): environment classes are wrapped
by ``FactoryEnvironment`` and step-style ones by ``StepwiseEnvironment`` only when built.

Rewards are in [0, 1]. Prompts are written so that a small instruction-tuned model has a chance.

- ``echo`` (tool class): call ``echo`` with the requested word; tests tool-call plumbing.
- ``arithmetic`` (step-style): one-digit addition in one turn.
- ``catch`` (tool class): move a paddle under a falling ball, four moves.
- ``wordle`` (tool class): find a five-letter word in six guesses from G/Y/_ feedback.
- ``guess_number`` (step-style): find a number in 1-20 from "Too high."/"Too low." hints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...errors import ConfigError
from ...types import Sample
from ..base import Environment
from . import arithmetic, catch, echo, guess_number, wordle

__all__ = ["EnvSpec", "ENV_NAMES", "get_env_spec"]


@dataclass(frozen=True)
class EnvSpec:
    """A bundled environment: how to build it and how to draw prompts for it."""

    #: The registry name, also the ``task_name`` of its samples.
    name: str
    #: One line for listings (``rollforge env list``).
    description: str
    #: Builds a fresh ``Environment``.
    build: Callable[[], Environment]
    #: ``samples(n, seed)``: ``n`` samples, the same ones for the same seed.
    samples: Callable[[int, int], list[Sample]]


_SPECS: dict[str, EnvSpec] = {
    spec.name: spec
    for spec in (
        EnvSpec("echo", "Call the echo tool with the requested word (one tool call).", echo.build, echo.samples),
        EnvSpec("arithmetic", "One-digit addition in one turn; 1.0 when the last number is the sum.", arithmetic.build, arithmetic.samples),
        EnvSpec("catch", "Move a paddle under a falling ball on a 5x5 board (multi-turn tool game).", catch.build, catch.samples),
        EnvSpec("wordle", "Find a five-letter word in six guesses with G/Y/_ feedback (tool game).", wordle.build, wordle.samples),
        EnvSpec("guess_number", "Find a number between 1 and 20 from 'Too high.'/'Too low.' (multi-turn).", guess_number.build, guess_number.samples),
    )
}

#: The names of the bundled environments, in registry order.
ENV_NAMES: tuple[str, ...] = tuple(_SPECS)


def get_env_spec(name: str) -> EnvSpec:
    """The bundled environment called ``name``; a ``ConfigError`` lists the valid names."""
    try:
        return _SPECS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown environment {name!r}; bundled environments are: {', '.join(ENV_NAMES)}"
        ) from None
