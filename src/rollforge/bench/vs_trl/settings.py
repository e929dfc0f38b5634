"""The settings of one comparison: a frozen value built once (from the flags, by ``bench gpu`` or by
``bench learning``'s sides) and read by both runners.

``Settings`` carries what both trainers train with (``runners``' docstring says how each side maps
it), the side-specific choices (rollforge's ``backend`` and ``max_staleness``, TRL's ``trl_vllm``
and ``trl_micro_batch``) and the comparison's own (``rounds``; with ``--best`` a non-empty
``candidates`` and their ``best_steps``). A candidate's changes are ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Settings:
    steps: int  # training steps per run, the first untimed
    batch_size: int  # prompts per step
    generations: int  # completions per prompt (the GRPO group)
    max_completion_tokens: int  # an episode's token budget after the prompt
    lr: float
    max_tool_calls: int = 0
    seed: int = 0
    rounds: int = 1  # runs of each trainer
    rollforge_mode: str = "async"  # rollforge's rollout mode
    backend: str = "hf"  # rollforge's generation backend
    max_staleness: int = 0  # rollforge's algorithm.max_staleness
    device: str | None = None  # None: rollforge "auto", TRL its default
    dtype: str = "float32"
    shuffle: bool = True
    skip_zero_advantage: bool = True
    max_turns: int | None = None  # rollforge's; None: max_tool_calls + 1
    max_new_tokens: int | None = None  # rollforge's per turn; None: max_completion_tokens
    trl_vllm: bool = False  # TRL generates with a colocated vLLM engine
    trl_micro_batch: int | None = None  # TRL's completions per loss forward; None: all of a step's
    candidates: tuple[str, ...] = ()  # --best: the candidates to time (``best.CANDIDATES``)
    best_steps: int | None = None  # --best: steps per candidate

    @property
    def completions(self) -> int:
        """Completions per step on each side."""
        return self.batch_size * self.generations

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Settings:
        """The fields ``values`` names (a JSON spec across processes may carry other keys too)."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in values.items() if k in names}
        return cls(**{**given, "candidates": tuple(given.get("candidates", ()))})  # JSON gives a list

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
