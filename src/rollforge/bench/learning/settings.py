"""The settings of ``rollforge bench learning``: a frozen value built once by the parent and rebuilt
by each side's process from the JSON spec it is handed.

``run`` is what both trainers train with (``vs_trl.settings.Settings``: the TRL comparison's
runners train both sides); the rest says what the bench itself does: the calculator's
``operations`` and ``balanced`` prompts, and the held-out evaluation (``eval_episodes`` questions
every ``eval_every`` steps). ``to_json`` is flat, as the report prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..vs_trl.settings import Settings


@dataclass(frozen=True)
class LearningSettings:
    run: Settings
    operations: tuple[str, ...]  # the calculator's operations (training and held-out questions)
    balanced: bool  # the calculator's prompts balanced over operations, as the quickstart's
    eval_every: int  # steps between held-out evaluations
    eval_episodes: int  # held-out questions

    @classmethod
    def from_json(cls, values: Mapping[str, Any]) -> LearningSettings:
        """From ``to_json``'s flat form (or the bench's flags and preset, which name the same keys)."""
        return cls(
            run=Settings.from_mapping(values),
            operations=tuple(values["operations"]),
            balanced=bool(values.get("balanced", False)),
            eval_every=values["eval_every"],
            eval_episodes=values["eval_episodes"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.run.as_dict(),
            "operations": list(self.operations),
            "balanced": self.balanced,
            "eval_every": self.eval_every,
            "eval_episodes": self.eval_episodes,
        }
