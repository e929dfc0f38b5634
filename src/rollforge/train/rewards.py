"""The reward of each episode: the environment's own reward plus weighted reward functions.

A reward function has the signature ``f(prompts, completions, environments, **columns)`` and
returns one ``float`` or ``None`` per sample (``None``: does not apply, e.g. a function written for
another environment of a multi-environment run). ``prompts`` and ``completions`` are lists of
message lists (``{role, content}`` dicts; completions are everything after the prompt),
``environments`` the per-episode environment objects (the TRL-style instance, or None), and every
other dataset column arrives as a list keyword (``task_name`` and ``trajectories`` too). An ``async
def`` function is awaited; sync ones run in a worker thread so a slow verifier does not block the
event loop.

The total of an episode is ``env_weight * total_reward + sum_i w_i * f_i`` over the functions that
apply. Per-function means skip ``None`` and are ``None`` (never NaN) when nothing applied.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import ConfigError
from ..types import Sample, Trajectory
from .config import RewardConfig
from .environments import import_attribute

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewardFunction:
    name: str
    function: Callable[..., Any]
    weight: float = 1.0


@dataclass(frozen=True)
class Rewards:
    totals: list[float]  # one per episode
    per_function: dict[str, list[float | None]]
    errors: dict[str, str]  # function name -> what it raised (its values count as None)


def load_reward_functions(configs: Sequence[RewardConfig]) -> list[RewardFunction]:
    out = []
    for c in configs:
        function = import_attribute(c.function)
        if not callable(function):
            raise ConfigError(f"reward function {c.function!r} is a {type(function).__name__}, not callable")
        out.append(RewardFunction(c.function.rpartition(":")[2], function, c.weight))
    return out


async def compute_rewards(
    trajectories: Sequence[Trajectory],
    samples: Sequence[Sample],
    functions: Sequence[RewardFunction],
    env_weight: float = 1.0,
) -> Rewards:
    prompts = [[m.to_chat() for m in s.prompt] for s in samples]
    completions = [[m.to_chat() for m in t.messages[len(s.prompt) :]] for t, s in zip(trajectories, samples)]
    columns: dict[str, list[Any]] = {"task_name": [s.task_name for s in samples], "trajectories": list(trajectories)}
    for key in sorted({k for s in samples for k in s.row}):
        columns.setdefault(key, [s.row.get(key) for s in samples])
    environments = [t.environment for t in trajectories]
    results = await asyncio.gather(
        *(_call(f, prompts, completions, environments, columns, len(samples)) for f in functions)
    )
    totals = [env_weight * t.total_reward for t in trajectories]
    per_function, errors = {}, {}
    for f, (values, error) in zip(functions, results):
        if error is not None:
            errors[f.name] = error
            logger.warning("reward function %s raised (its rewards count as None this step): %s", f.name, error)
        per_function[f.name] = values
        for i, v in enumerate(values):
            if v is not None:
                totals[i] += f.weight * v
    return Rewards(totals, per_function, errors)


async def _call(f: RewardFunction, prompts, completions, environments, columns, n: int):
    """(values, None), or ([None] * n, error text) when the function raised: a failing verifier
    costs its signal for one step, not the run. A wrong return shape is a bug: ``ConfigError``."""
    try:
        if inspect.iscoroutinefunction(f.function):
            values = await f.function(prompts, completions, environments=environments, **columns)
        else:
            values = await asyncio.to_thread(f.function, prompts, completions, environments=environments, **columns)
    except Exception as exc:  # user code: recorded and reported, never fatal
        return [None] * n, f"{type(exc).__name__}: {exc}"
    values = list(values) if values is not None else None
    if values is None or len(values) != n:
        got = "None" if values is None else f"{len(values)} values"
        raise ConfigError(f"reward function {f.name!r} returned {got}; expected a list of {n} floats or None")
    out: list[float | None] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"reward function {f.name!r} returned {v!r}; expected a float or None") from None
        if math.isnan(v):
            raise ConfigError(f"reward function {f.name!r} returned NaN; return None for 'does not apply'")
        out.append(v)
    return out, None


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """Mean over the values that are not None; None when there are none (never NaN)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
