"""The reward of each episode: the environment's own reward plus weighted reward functions.

A reward function is a plain function, sync or ``async def``, with the signature ``f(prompts,
completions, environments, **columns)``, called with keyword arguments as TRL calls it (so TRL's
``f(completions, **kwargs)`` works), or, when its parameter names differ, with ``prompts`` and
``completions`` positional; it
returns one ``float`` or ``None`` per sample (``None``: does not apply, e.g. a function written for
another environment of a multi-environment run). ``prompts`` and ``completions`` are lists of
message lists (``{role, content}`` dicts): a completion is exactly the messages generated after the
prompt the episode rendered (assistant and tool turns; an injected tool system prompt or text that
``reset`` added belongs to the prompt). ``environments`` are the per-episode environment objects
(the TRL-style instance, or None); ``completion_ids`` the token ids after the prompt; every other
dataset column but ``prompt`` and ``completion`` arrives as a list keyword (``task_name`` and
``trajectories`` too). Sync functions
run on rollforge's worker threads (``workers.py``) so a slow verifier does not block the event loop.
A ``RewardFunction`` adds a name and a weight; a plain function is named after itself, weight 1.

A function whose signature cannot take these arguments is a ``ConfigError`` before it is called.
What a function raises is its own failure (``boundary.boundary("reward")``): its values count as
None for that step and the error is reported; a bug in rollforge still propagates.

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

from ..boundary import boundary, call_user
from ..errors import ConfigError, EpisodeFailed
from ..workers import run_blocking
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


def as_reward_functions(functions: Sequence[RewardFunction | Callable[..., Any]]) -> list[RewardFunction]:
    """Plain functions (sync or async) become ``RewardFunction``s named after themselves (a
    repeated name gets ``_2``, ``_3``...); anything not callable is a ``ConfigError``."""
    out: list[RewardFunction] = []
    names: set[str] = set()
    for f in functions:
        if not isinstance(f, RewardFunction):
            if not callable(f):
                raise ConfigError(
                    f"a reward function must be a function f(prompts, completions, **kwargs) or a "
                    f"RewardFunction, got {f!r} ({type(f).__name__})"
                )
            f = RewardFunction(getattr(f, "__name__", None) or type(f).__name__, f)
        name, n = f.name, 1
        while name in names:
            n += 1
            name = f"{f.name}_{n}"
        names.add(name)
        out.append(f if name == f.name else RewardFunction(name, f.function, f.weight))
    return out


def completion_messages(trajectory: Trajectory, sample: Sample) -> list[dict[str, Any]]:
    """The messages generated after the prompt the episode rendered, as ``{role, content}`` dicts."""
    start = trajectory.prompt_messages if trajectory.prompt_messages is not None else len(sample.prompt)
    return [m.to_chat() for m in trajectory.messages[start:]]


async def compute_rewards(
    trajectories: Sequence[Trajectory],
    samples: Sequence[Sample],
    functions: Sequence[RewardFunction | Callable[..., Any]],
    env_weight: float = 1.0,
) -> Rewards:
    functions = as_reward_functions(functions)
    prompts = [[m.to_chat() for m in s.prompt] for s in samples]
    completions = [completion_messages(t, s) for t, s in zip(trajectories, samples)]
    columns: dict[str, list[Any]] = {
        "task_name": [s.task_name for s in samples],
        "trajectories": list(trajectories),
        "completion_ids": [list(t.token_ids[t.prompt_length :]) for t in trajectories],
    }
    core = {"prompts": prompts, "completions": completions, "environments": [t.environment for t in trajectories]}
    for key in sorted({k for s in samples for k in s.row} - {"prompt", "completion", *core}):  # as TRL passes them
        columns.setdefault(key, [s.row.get(key) for s in samples])
    arguments = {**core, **columns}
    positional = [_positional(f, arguments) for f in functions]
    results = await asyncio.gather(*(_call(f, p, arguments, len(samples)) for f, p in zip(functions, positional)))
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


def _positional(f: RewardFunction, arguments: dict[str, Any]) -> bool:
    """Whether ``f`` takes ``prompts`` and ``completions`` positionally (its names differ); a
    signature that fits neither way is a ``ConfigError``."""
    try:
        signature = inspect.signature(f.function)
    except (TypeError, ValueError):  # builtins and C callables: nothing to check
        return False
    try:
        signature.bind(**arguments)
        return False
    except TypeError as exc:
        error = exc
    rest = {k: v for k, v in arguments.items() if k not in ("prompts", "completions")}
    try:
        signature.bind(arguments["prompts"], arguments["completions"], **rest)
        return True
    except TypeError:
        raise ConfigError(
            f"reward function {f.name!r} cannot be called as f(prompts=..., completions=..., "
            f"environments=..., <columns>=...): {error}; give it a **kwargs parameter "
            f"(columns passed: {', '.join(a for a in arguments if a not in ('prompts', 'completions'))})"
        ) from None


async def _call(f: RewardFunction, positional: bool, arguments: dict[str, Any], n: int):
    """(values, None), or ([None] * n, error text) when the function raised: a failing verifier
    costs its signal for one step, not the run. A wrong return shape is a bug: ``ConfigError``."""
    args: tuple[Any, ...] = ()
    if positional:
        arguments = dict(arguments)
        args = (arguments.pop("prompts"), arguments.pop("completions"))
    try:
        with boundary("reward", None):
            if inspect.iscoroutinefunction(f.function):
                values = await call_user(f.function, *args, **arguments)
            else:
                values = await run_blocking(f.function, *args, **arguments)
                if inspect.isawaitable(values):  # a sync wrapper around a coroutine
                    values = await values
    except EpisodeFailed as failed:  # user code: recorded and reported, never fatal
        return [None] * n, failed.failure.message
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
        if math.isinf(v):
            raise ConfigError(f"reward function {f.name!r} returned {v}; expected a finite float or None")
        out.append(v)
    return out, None


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """Mean over the values that are not None; None when there are none (never NaN)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
