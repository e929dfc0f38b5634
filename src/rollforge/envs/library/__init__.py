"""Bundled environments, by name: ``get_env_spec("catch").build()`` and ``.samples(n, seed)``.

Each environment lives in its own module with its prompts and sample generator; this registry
only names them. Importing it is light (no torch, no tokenizer): environment classes are wrapped
by ``FactoryEnvironment`` and step-style ones by ``StepwiseEnvironment`` only when built.

Rewards are in [0, 1]. Prompts are written so that a small instruction-tuned model has a chance.

- ``echo`` (tool class): call ``echo`` with the requested word; tests tool-call plumbing.
- ``arithmetic`` (step-style): one-digit addition in one turn.
- ``calculator`` (tool class): three-digit arithmetic by calling the right operation tool, then
  ``answer``; its expert picks the tool at random (teaches the format, not the choice).
- ``catch`` (tool class): move a paddle under a falling ball, four moves.
- ``wordle`` (tool class): find a five-letter word in six guesses from G/Y/_ feedback.
- ``guess_number`` (step-style): find a number in 1-20 from "Too high."/"Too low." hints.
- ``python_code`` (tool class): write a function, run code and submit it in a sandbox; hidden tests.
- ``shapes`` (tool class, images): count the circles in three pictures a tool shows, one per turn.

``echo``, ``calculator``, ``catch``, ``wordle``, ``guess_number`` and ``shapes`` have an ``expert`` (``envs/experts.py``): a
scripted player whose episodes are demonstrations for supervised warm-up.

Adapters of task libraries (``envs/adapters``, optional extras; importing them here is light, the
library itself is imported when an environment is built or sampled):

- ``math`` (step-style): generated problems, answers verified by math-verify;
- ``frozenlake`` (tool class): gymnasium's FrozenLake on a seeded 4x4 map;
- families named ``family:item``, built on demand by ``get_env_spec``: ``reasoning_gym:<dataset>``,
  ``textarena:<game id>``, ``gymnasium:<env id>``, ``skyrl:<id or module:Class>``,
  ``nemogym:<server URL>`` (a running NeMo Gym resources server; its dataset rows are the prompts),
  ``verifiers:<taskset id or path>`` (a verifiers 0.4 taskset in its own venv; its tasks are the prompts).
  A few members are listed in ``ENV_NAMES`` so
  that ``check_env`` runs on them in CI like on every other bundled environment.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from ...errors import ConfigError
from ...types import Sample
from ..base import Environment
from ..experts import Expert
from ..adapters import gymnasium_env, math_env, nemo_gym, reasoning_gym_env, skyrl_env, textarena_env, verifiers_env
from . import arithmetic, calculator, catch, echo, guess_number, python_code, shapes, wordle

__all__ = ["EnvSpec", "ENV_NAMES", "get_env_spec", "is_family_member"]


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
    #: Environments graded by hidden tests: for a sample, the answer that ignores the task (a
    #: constant, the input given back) scoring highest, and its score; ``check_env`` reports it.
    best_trivial_answer: Callable[[Sample], tuple[str, float]] | None = None
    #: A scripted player for demonstrations (None: the environment has none).
    expert: Expert | None = None


_SPECS: dict[str, EnvSpec] = {
    spec.name: spec
    for spec in (
        EnvSpec(
            "echo",
            "Call the echo tool with the requested word (one tool call).",
            echo.build,
            echo.samples,
            expert=echo.expert,
        ),
        EnvSpec(
            "arithmetic",
            "One-digit addition in one turn; 1.0 when the last number is the sum.",
            arithmetic.build,
            arithmetic.samples,
        ),
        EnvSpec(
            "calculator",
            "Three-digit plus/minus/times: call the add/subtract/multiply tool it needs, then answer the result.",
            calculator.build,
            calculator.samples,
            expert=calculator.expert,
        ),
        EnvSpec(
            "catch",
            "Move a paddle under a falling ball on a 5x5 board (multi-turn tool game).",
            catch.build,
            catch.samples,
            expert=catch.expert,
        ),
        EnvSpec(
            "wordle",
            "Find a five-letter word in six guesses with G/Y/_ feedback (tool game).",
            wordle.build,
            wordle.samples,
            expert=wordle.expert,
        ),
        EnvSpec(
            "guess_number",
            "Find a number between 1 and 20 from 'Too high.'/'Too low.' (multi-turn).",
            guess_number.build,
            guess_number.samples,
            expert=guess_number.expert,
        ),
        EnvSpec(
            "python_code",
            "Write a Python function; run and submit code in a sandbox; hidden tests grade it.",
            python_code.build,
            python_code.samples,
            best_trivial_answer=python_code.best_trivial_answer,
        ),
        EnvSpec(
            "shapes",
            "Count the red circles in three pictures shown by a tool (images: a vision-language model).",
            shapes.build,
            shapes.samples,
            expert=shapes.expert,
        ),
        EnvSpec(
            "math",
            "Generated math problems; the answer is verified symbolically by math-verify.",
            math_env.build,
            math_env.samples,
        ),
        EnvSpec(
            "frozenlake",
            "Gymnasium FrozenLake 4x4 (not slippery) as a tool game: move(direction).",
            gymnasium_env.build_frozenlake,
            gymnasium_env.samples_frozenlake,
        ),
    )
}

#: ``family:item`` names: (what the family is, the check that raises for a bad item, the adapter).
_FAMILIES = {
    "reasoning_gym": (
        "reasoning-gym dataset {}: one turn, scored by the dataset's score_answer.",
        reasoning_gym_env.check_dataset,
        reasoning_gym_env,
    ),
    "textarena": (
        "textarena single-player game {} (multi-turn; moves in square brackets).",
        textarena_env.check_game,
        textarena_env,
    ),
    "gymnasium": ("gymnasium environment {} as a tool game: act(action).", gymnasium_env.check_env_id, gymnasium_env),
    "skyrl": (
        "SkyRL-Gym environment {} (BaseTextEnv, run unchanged; per-turn rewards).",
        skyrl_env.check_env_id,
        skyrl_env,
    ),
    "nemogym": ("NeMo Gym resources server at {} (prompts: its dataset rows, --data).", nemo_gym.check_url, nemo_gym),
    "verifiers": (
        "verifiers taskset {}, run unchanged in its own venv; verifiers' own reward.",
        verifiers_env.check_env_id,
        verifiers_env,
    ),
}

#: Family members checked in CI like the bundled environments (all run offline).
_LISTED_MEMBERS = (
    "reasoning_gym:basic_arithmetic",
    "reasoning_gym:leg_counting",
    "textarena:GuessTheNumber-v0",
    "textarena:Mastermind-v0",
    "textarena:Sudoku-v0-very-easy",
    "gymnasium:CliffWalking-v1",
)

#: The names of the bundled environments, in registry order, then the listed family members.
ENV_NAMES: tuple[str, ...] = (*_SPECS, *_LISTED_MEMBERS)


def get_env_spec(name: str) -> EnvSpec:
    """The bundled environment called ``name``, or the member of a family (``family:item``).

    A ``ConfigError`` lists the valid names; a family member needs its library (else
    ``MissingDependency``), which checks the item.
    """
    if isinstance(name, str) and name in _SPECS:
        return _SPECS[name]
    family, _, item = name.partition(":") if isinstance(name, str) else ("", "", "")
    if family in _FAMILIES and item:
        return family_member(family, item)
    families = ", ".join(f"{f}:<name>" for f in _FAMILIES)
    raise ConfigError(
        f"unknown environment {name!r}; bundled environments are: {', '.join(ENV_NAMES)}; families: {families}"
    )


def is_family_member(name: str) -> bool:
    """Whether ``name`` is ``family:item`` of a known family, valid item or not: the name is then
    rollforge's, never an import path, and ``get_env_spec`` says what is wrong with the item."""
    family, sep, item = name.partition(":")
    return bool(sep) and family in _FAMILIES and bool(item)


@functools.lru_cache(maxsize=None)
def family_member(family: str, item: str) -> EnvSpec:
    """The spec of ``FAMILY:ITEM`` (a task library's game or task), built once per name."""
    description, check, adapter = _FAMILIES[family]
    check(item)
    return EnvSpec(
        f"{family}:{item}",
        description.format(item),
        functools.partial(adapter.build, item),
        functools.partial(adapter.samples, item),
    )
