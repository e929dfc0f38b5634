"""The settings of what a run reads: its ``environments``, its ``data`` (prompts) and its
``rewards`` (reward functions).

Closed, typed and documented like every other section (``rollforge train --help-config`` prints
them): ``TrainConfig`` holds all three, ``SFTConfig``'s rejection sampling holds environments, and
``rollforge rollout`` and ``rollforge eval`` build ``EnvConfig`` and ``RewardConfig`` values from
their ``--env`` and ``--reward`` flags.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class EnvConfig(_Section):
    name: str
    """A bundled environment (``rollforge env list``), an OpenEnv server URL, or
    ``module:attribute`` / ``file.py:attribute`` naming an environment class, a step-style object,
    a factory or an ``Environment``."""
    weight: float = Field(1.0, gt=0)
    """Share of the prompts drawn from this environment's own generator (when ``data.path`` is unset)."""
    options: dict[str, Any] = {}
    """Keyword arguments of the bundled environment's sample generator (e.g. ``digits: 2``)."""
    task_name: str | None = None
    """Task name routed to this environment; default: the bundled name or the attribute's name."""


class DataConfig(_Section):
    path: str | None = None
    """Prompts file (``.jsonl``/``.json``/``.parquet``) or a saved ``datasets`` directory. Columns:
    ``prompt`` (text or a list of messages), optional ``task_name``/``environment``; the others reach
    ``reset(**row)`` and reward functions. Unset: prompts come from the environments' generators."""
    size: int = Field(2048, ge=1)
    """Prompts drawn from the environments' generators (when ``path`` is unset)."""
    system_prompt: str | None = None
    """Prepended as a system message to prompts given as text."""
    shuffle: bool = True
    """Shuffle prompts every epoch (seeded by ``seed`` and the epoch)."""


class RewardConfig(_Section):
    function: str
    """``module:function`` with the signature ``f(prompts, completions, environments, **columns)``
    returning one float or None (not applicable) per sample; ``async def`` is awaited."""
    weight: float = 1.0
    """Multiplies the function's rewards in the episode total."""
    options: dict[str, Any] | None = None
    """Keyword arguments of ``function`` when it names a factory of the reward function (called once
    at start; an unknown option is an error), e.g. ``rollforge.train.judge:LLMJudge`` with
    ``{base_url, model, rubric, timeout_s, max_concurrency}``. None: ``function`` is the reward function."""
