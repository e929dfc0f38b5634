"""The reward of each episode: the environment's own reward plus weighted reward functions.

One place for training (the config's ``rewards``), ``rollforge rollout`` and ``rollforge eval``
(``--reward module.py:function``, repeatable): ``load_reward_functions`` reads them,
``compute_rewards`` applies them, ``unscored`` says in one line when nothing scores a rollout.

A reward function is a plain function, sync or ``async def``, with the signature ``f(prompts,
completions, environments, **columns)``, called with keyword arguments as TRL calls it (so TRL's
``f(completions, **kwargs)`` works), or, when its parameter names differ, with ``prompts`` and
``completions`` positional; it
returns one ``float`` or ``None`` per sample (``None``: does not apply, e.g. a function written for
another environment of a multi-environment run). ``prompts`` and ``completions`` are lists of
message lists (``{role, content}`` dicts): a completion is exactly the messages generated after the
prompt the episode rendered (assistant and tool turns; an injected tool system prompt or text that
``reset`` added belongs to the prompt). ``environments`` are the per-episode environment objects
(the TRL-style instance; None for environments that are no class, such as the step-style ones);
``completion_ids`` the token ids after the prompt; every other
dataset column but ``prompt`` and ``completion`` arrives as a list keyword (``task_name`` and
``trajectories`` too). The lists hold the episodes whose reward can be known: an episode that
ended in an infrastructure failure (``Trajectory.outcome``: the backend failed, ``reset`` raised
and left no environment object, a step hung) is never handed to a function, whose values for it
are None, so ``env.attribute`` is safe on every environment a function sees. Sync functions
run on rollforge's worker threads (``workers.py``) so a slow verifier does not block the event loop.
A ``RewardFunction`` adds a name and a weight; a plain function is named after itself, weight 1.

A function whose signature cannot take these arguments is a ``ConfigError`` before it is called.
What a function raises is its own failure (``boundary.boundary("reward")``): its values count as
None for that step and the error is reported; a bug in rollforge still propagates. A reward service
that fails (an LLM judge timing out, ``train/judge.py``) is not the function's failure but the
infrastructure's: ``RewardUnavailable``, raised (every episode of the call) or returned in place of
values (those episodes), makes the episode's reward unknown, never 0 or None: ``Rewards.unavailable``,
which ``record_unavailable`` files on the trajectories as ``reward_unavailable`` (an infrastructure
failure, out of its group's baseline). With ``options`` (``RewardConfig``), ``function`` names a
factory called once with them, and what it returns is the reward function.

The total of an episode is ``env_weight * total_reward + sum_i w_i * f_i`` over the functions that
apply. Per-function means skip ``None`` and are ``None`` (never NaN) when nothing applied.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..boundary import boundary, call_user
from ..envs.base import Environment
from ..envs.factory import FactoryEnvironment
from ..errors import ConfigError, EpisodeFailed, RewardUnavailable
from ..types import Failure, Sample, Trajectory
from ..workers import run_blocking
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
    errors: dict[str, str]  # function name -> what it raised (its values count as None), or what it could not compute
    #: episode position -> why its reward is unknown (a ``RewardUnavailable``); this rank's, before
    #: ``record_unavailable`` files it on the trajectories
    unavailable: dict[int, str] = field(default_factory=dict)


def load_reward_functions(configs: Sequence[RewardConfig]) -> list[RewardFunction]:
    out = []
    for c in configs:
        function = import_attribute(c.function)
        if c.options is not None:
            function = _built(c.function, function, c.options)
        elif inspect.isclass(function):
            raise ConfigError(f"reward function {c.function!r} is a class; give its keyword arguments as 'options'")
        if not callable(function):
            raise ConfigError(f"reward function {c.function!r} is a {type(function).__name__}, not callable")
        out.append(RewardFunction(c.function.rpartition(":")[2], function, c.weight))
    return out


def unscored(
    task_to_env: Mapping[str, Environment], tasks: Iterable[str], functions: Sequence[Any], flag: str
) -> str | None:
    """Why nothing scores the episodes of ``tasks``, in one line, or None when something may: no
    reward function (``flag`` names how to give one), and every environment a class (TRL style)
    without ``get_reward()``, whose steps all score 0 (a 0 that no one gave). Environments of other
    kinds, and factories that are no class, may score: they are taken to."""
    if functions:
        return None
    names: list[str] = []
    for task in sorted(set(tasks)):
        classes = _environment_classes(task_to_env[task])
        if classes is None or any(callable(getattr(c, "get_reward", None)) for c in classes):
            return None
        names += [c.__name__ for c in classes if c.__name__ not in names]
    what = (
        f"the environment class {names[0]} has"
        if len(names) == 1
        else f"the environment classes {', '.join(names)} have"
    )
    return f"{what} no get_reward() and no reward function was given ({flag})"


def _environment_classes(env: Environment) -> list[type] | None:
    """The classes of a ``FactoryEnvironment`` (one, or its dict's); None when any factory is no class."""
    if not isinstance(env, FactoryEnvironment):
        return None
    factories = env.factory.values() if isinstance(env.factory, dict) else [env.factory]
    classes = [f.func if isinstance(f, functools.partial) else f for f in factories]
    return classes if all(inspect.isclass(c) for c in classes) else None


def _built(name: str, factory: Any, options: Mapping[str, Any]) -> Any:
    """``factory(**options)``; an option its signature does not take, or a required one missing,
    is a ``ConfigError`` naming it (a factory's own checks raise their own)."""
    if not callable(factory):
        raise ConfigError(f"reward function {name!r} has options but is a {type(factory).__name__}, not a factory")
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins and C callables: nothing to check
        parameters = None
    if parameters is not None and not any(p.kind is p.VAR_KEYWORD for p in parameters):
        named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key in options:
            if key not in {p.name for p in named}:
                raise ConfigError(
                    f"reward function {name!r} has no option {key!r}; "
                    f"expected one of: {', '.join(p.name for p in named)}"
                )
        for p in named:
            if p.default is p.empty and p.name not in options:
                raise ConfigError(f"reward function {name!r} needs the option {p.name!r}")
    return call_user(factory, **options)


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
    """The rewards of ``trajectories`` (of ``samples``, in the same order; see the module docstring).
    The functions are handed only the episodes whose reward can be known: an infrastructure failure
    (``Trajectory.outcome``; a failed ``reset`` leaves its ``environments`` entry None) is left out
    of every call, its values None."""
    functions = as_reward_functions(functions)
    scored = [i for i, t in enumerate(trajectories) if t.outcome != "infra_failure"]
    keys = {k for s in samples for k in s.row}  # every column, from all the samples
    arguments = _arguments([trajectories[i] for i in scored], [samples[i] for i in scored], keys)
    positional = [_positional(f, arguments) for f in functions]  # a signature that cannot fit: refused now
    calls = (_call(f, p, arguments, len(scored)) for f, p in zip(functions, positional))
    results = await asyncio.gather(*calls) if scored else [([], None, {}) for _ in functions]
    totals = [env_weight * t.total_reward for t in trajectories]
    per_function, errors, unavailable = {}, {}, {}
    for f, (values, error, missing) in zip(functions, results):
        if error is not None:
            errors[f.name] = error
            logger.warning("reward function %s raised (its rewards count as None this step): %s", f.name, error)
        if missing:
            errors[f.name] = f"{len(missing)} of {len(values)} rewards unavailable: {next(iter(missing.values()))}"
            logger.warning("reward function %s: %s (infrastructure failures)", f.name, errors[f.name])
        for k, why in missing.items():
            unavailable.setdefault(scored[k], f"{f.name}: {why}")
        per_function[f.name] = everyone = [None] * len(trajectories)
        for i, v in zip(scored, values):
            everyone[i] = v
            if v is not None:
                totals[i] += f.weight * v
    return Rewards(totals, per_function, errors, unavailable)


def _arguments(trajectories: Sequence[Trajectory], samples: Sequence[Sample], keys: set[str]) -> dict[str, list[Any]]:
    """The keyword arguments of a reward function's call over these episodes (see the module
    docstring), with a list for each row column of ``keys``."""
    prompts = [[m.to_chat() for m in s.prompt] for s in samples]
    completions = [completion_messages(t, s) for t, s in zip(trajectories, samples)]
    columns: dict[str, list[Any]] = {
        "task_name": [s.task_name for s in samples],
        "trajectories": list(trajectories),
        "completion_ids": [list(t.token_ids[t.prompt_length :]) for t in trajectories],
    }
    core = {"prompts": prompts, "completions": completions, "environments": [t.environment for t in trajectories]}
    for key in sorted(keys - {"prompt", "completion", *core}):  # as TRL passes them
        columns.setdefault(key, [s.row.get(key) for s in samples])
    return {**core, **columns}


_ENDINGS = {"terminated": "terminated", "truncated": "been truncated", "max_turns_reached": "run out of turns"}


def record_unavailable(trajectories: Sequence[Trajectory], rewards: Rewards) -> list[Trajectory]:
    """The trajectories, those whose reward is unavailable (``Rewards.unavailable``) with that filed
    as their ``error`` (``reward_unavailable``: an infrastructure failure, so training leaves them out
    of their group's baseline and their tokens out of the loss). An earlier infrastructure failure
    stands; a policy failure's error, or how the episode ended, is named in the new message (a
    trajectory with an error has no other ending)."""
    out = list(trajectories)
    for i, why in rewards.unavailable.items():
        t = out[i]
        if t.outcome == "infra_failure":
            continue
        ending = _ENDINGS.get(t.ending)
        if t.error is not None:
            why = f"{why} (after {t.error.kind}: {t.error.message})"
        elif ending is not None:
            why = f"{why} (the episode had {ending})"
        out[i] = replace(t, ending="error", error=Failure("reward_unavailable", why))
    return out


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
    """(values, None, {}); ([None] * n, error text, {}) when the function raised: a failing verifier
    costs its signal for one step, not the run; (values, None, {position: why}) for the rewards it
    could not compute (``RewardUnavailable``: those values are None, the episodes infrastructure
    failures). A wrong return shape is a bug: ``ConfigError``."""
    args: tuple[Any, ...] = ()
    if positional:
        arguments = dict(arguments)
        args = (arguments.pop("prompts"), arguments.pop("completions"))
    try:
        with boundary("reward", None):
            try:
                values = await _invoke(f.function, args, arguments)
            except RewardUnavailable as unavailable:  # its reward service failed, not the function
                values = [unavailable] * n
    except EpisodeFailed as failed:  # user code: recorded and reported, never fatal
        return [None] * n, failed.failure.message, {}
    values = list(values) if values is not None else None
    if values is None or len(values) != n:
        got = "None" if values is None else f"{len(values)} values"
        raise ConfigError(f"reward function {f.name!r} returned {got}; expected a list of {n} floats or None")
    missing = {i: str(v) for i, v in enumerate(values) if isinstance(v, RewardUnavailable)}
    return [None if i in missing else _checked(f, v) for i, v in enumerate(values)], None, missing


async def _invoke(function: Callable[..., Any], args: tuple[Any, ...], arguments: dict[str, Any]) -> Any:
    """``async def`` functions (and objects with an ``async def __call__``) run on the event loop,
    the others on a worker thread."""
    if inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(getattr(function, "__call__", None)):
        return await call_user(function, *args, **arguments)
    values = await run_blocking(function, *args, **arguments)
    return await values if inspect.isawaitable(values) else values  # a sync wrapper around a coroutine


def _checked(f: RewardFunction, v: Any) -> float | None:
    if v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"reward function {f.name!r} returned {v!r}; expected a float or None") from None
    if math.isnan(v):
        raise ConfigError(f"reward function {f.name!r} returned NaN; return None for 'does not apply'")
    if math.isinf(v):
        raise ConfigError(f"reward function {f.name!r} returned {v}; expected a finite float or None")
    return v


def mean_or_none(values: Sequence[float | None]) -> float | None:
    """Mean over the values that are not None; None when there are none (never NaN)."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
