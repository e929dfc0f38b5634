"""``environment_factory`` adapter: plain environment classes as ``EnvSession``s.

Design: an environment class (TRL / OpenEnv style) is a plain object with a no-argument
constructor, ``reset(**row) -> str | None``, public methods as tools (``envs/tools.py``), and
optionally ``done`` and ``truncated`` attributes, ``get_reward()`` and ``close()``. ``FactoryEnvironment`` holds the
factory; each episode gets a ``FactorySession`` that builds its own object lazily inside ``reset``,
so a constructor that raises fails that episode only (the engine records it) and never the batch.

Per episode:

- ``reset``: build the object, call ``obj.reset(**columns)`` with every row column except
  ``prompt``; when ``reset`` takes no ``**kwargs`` only the columns its signature names are passed
  (and a required parameter with no column is a ``ConfigError``). A returned string is appended to
  the last user message of the prompt (a new user message when the prompt ends otherwise); images
  returned as a tool returns them (below) go to that message's images.
- ``step``: run the tool calls of the last assistant message in order. A bad call (unreadable,
  unknown tool, bad arguments, tool raised) becomes a tool message ``Error: ...`` plus a counted
  ``Failure``; the episode goes on. No calls means the model answered: the episode terminates.
  Once ``obj.done`` is truthy no further call runs and the episode ends: truncated when
  ``obj.truncated`` is truthy too (a limit outside the task cut it off, as Gymnasium's
  ``truncated``), else terminated. Step rewards are 0;
  the reward is ``get_reward()``, collected by ``finish``.
- Sync user methods run on rollforge's worker threads (``workers.py``; ``run_in_thread=True``, the
  default) so a slow or hung environment never blocks other episodes; ``async def`` methods are
  awaited on the loop. Every user call goes through ``boundary.call_user`` (see ``boundary.py``).

Tool results become the content of the tool message: a string as it is, ``None`` as empty, any
other value as JSON text (``json.dumps``; what JSON cannot hold falls back to ``str``), as OpenEnv
observations are. Images —
objects with ``save``, ``size`` and ``mode`` like PIL images, alone or mixed with strings in a
list — go to ``Message.images``; PIL itself is never imported. Image content blocks
(``{"type": "image", "image": <PIL image or bytes>}``, or MCP-style ``{"type": "image", "data":
<base64>}``) count as images too, and text blocks (``{"type": "text", "text": ...}``) as text.
Declare ``produces_images=True`` so that a text-only backend is refused before the rollout starts
(an undeclared image fails its episode instead, with that reason).
"""

from __future__ import annotations

import base64
import binascii
import functools
import inspect
import json
import math
import weakref
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from ..boundary import boundary, call_user
from ..errors import ConfigError, EnvironmentError_, EpisodeFailed, ToolArgumentError
from ..json_forms import is_image
from ..types import Failure, FailureKind, Message, Sample, ToolCall
from .base import BaseSession, Environment, Reset, Step, append_to_last_user, check_max_sessions
from ..workers import run_blocking
from .tools import Tool, class_tools, discover_tools, validate_arguments

#: The row column that selects a factory when ``environment_factory`` is a dict.
ENVIRONMENT_COLUMN = "environment"


def _check_factory(factory: Any, label: str) -> None:
    if not callable(factory):
        raise ConfigError(
            f"{label} must be a class, a zero-argument callable or a dict {{name: factory}}, "
            f"got {factory!r} ({type(factory).__name__})"
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins and C types have no signature to check
        return
    try:
        signature.bind()
    except TypeError as exc:
        raise ConfigError(f"{label} {factory!r} must be callable with no arguments: {exc}") from None


class FactoryEnvironment(Environment):
    """Opens one ``FactorySession`` per episode from a class, a callable or a dict of them."""

    def __init__(
        self,
        factory: Callable[[], Any] | Mapping[str, Callable[[], Any]],
        *,
        max_sessions: int | None = None,
        run_in_thread: bool = True,
        produces_images: bool = False,
    ):
        if isinstance(factory, Mapping):
            if not factory:
                raise ConfigError("environment_factory is an empty dict; give at least one {name: factory}")
            for name, item in factory.items():
                if not isinstance(name, str):
                    raise ConfigError(f"environment_factory dict keys must be str names, got {name!r}")
                _check_factory(item, f"environment_factory[{name!r}]")
        else:
            _check_factory(factory, "environment_factory")
        check_max_sessions(max_sessions)
        self.factory = dict(factory) if isinstance(factory, Mapping) else factory
        self.max_sessions = max_sessions
        self.run_in_thread = run_in_thread
        #: Tools may return images: the engine then requires a backend that accepts them.
        self.produces_images = bool(produces_images)

    def open(self, sample: Sample) -> FactorySession:
        if not isinstance(self.factory, dict):
            return FactorySession(self.factory, run_in_thread=self.run_in_thread)
        valid = ", ".join(repr(name) for name in self.factory)
        if ENVIRONMENT_COLUMN not in sample.row:
            raise ConfigError(
                f"the sample has no {ENVIRONMENT_COLUMN!r} column, which a dict environment_factory needs "
                f"to pick one of: {valid}"
            )
        name = sample.row[ENVIRONMENT_COLUMN]
        if not isinstance(name, str) or name not in self.factory:
            raise ConfigError(f"environment {name!r} (from the {ENVIRONMENT_COLUMN!r} column) is not one of: {valid}")
        return FactorySession(self.factory[name], run_in_thread=self.run_in_thread, name=name)

    def offered_tools(self, sample: Sample) -> tuple[dict[str, Any], ...] | None:
        """Known when the factory is a class (or a ``functools.partial`` of one): its methods."""
        factory = self.factory
        if isinstance(factory, dict):
            name = sample.row.get(ENVIRONMENT_COLUMN)
            factory = factory.get(name) if isinstance(name, str) else None
        if isinstance(factory, functools.partial):
            factory = factory.func
        if not inspect.isclass(factory):
            return None  # a callable may build any class: known only once an episode builds it
        return _schemas(factory, class_tools(factory))


def check_routes(samples: Sequence[Sample], task_to_env: Mapping[str, Environment]) -> None:
    """Every prompt's ``environment`` column names an environment that exists: a factory of its
    dict of factories, or else a task of ``task_to_env``. Checked before any generation (training,
    the CLI and the rollout engine), because a bad name would otherwise fail at run time, one
    episode at a time, or be played by an environment it was not written for. Prompt rows are
    counted from 1; every ``task_name`` must already be in ``task_to_env``."""
    for n, sample in enumerate(samples, 1):
        env = task_to_env[sample.task_name]
        factories = env.factory if isinstance(env, FactoryEnvironment) else None
        if isinstance(factories, dict):
            chosen = sample.row.get(ENVIRONMENT_COLUMN)
            if not isinstance(chosen, str) or chosen not in factories:
                have = "no" if ENVIRONMENT_COLUMN not in sample.row else f"the value {chosen!r} in its"
                raise ConfigError(
                    f"prompt row {n} has {have} {ENVIRONMENT_COLUMN!r} column, but {sample.task_name!r} has "
                    f"factories only for {sorted(factories)}"
                )
        elif ENVIRONMENT_COLUMN in sample.row:
            chosen = sample.row[ENVIRONMENT_COLUMN]
            if chosen != sample.task_name and (not isinstance(chosen, str) or chosen not in task_to_env):
                raise ConfigError(
                    f"prompt row {n}: {ENVIRONMENT_COLUMN} {chosen!r} names no configured environment "
                    f"(configured: {sorted(task_to_env)})"
                )


class FactorySession(BaseSession):
    """One episode of one environment object (see the module docstring)."""

    def __init__(self, factory: Callable[[], Any], *, run_in_thread: bool = True, name: str | None = None):
        self.factory = factory
        self.name = name
        self.run_in_thread = run_in_thread
        self.tools: dict[str, Tool] = {}
        self._obj: Any = None
        self._closed = False

    @property
    def handle(self) -> Any:
        return self._obj

    async def _run(self, function: Callable[..., Any], /, **kwargs: Any) -> Any:
        if inspect.iscoroutinefunction(function):
            result = await call_user(function, **kwargs)
        elif self.run_in_thread:
            result = await run_blocking(function, **kwargs)
        else:
            result = call_user(function, **kwargs)
        if inspect.isawaitable(result):  # a sync wrapper around a coroutine
            result = await result
        return result

    def _done(self) -> bool:
        return self._flag("done")

    def _flag(self, name: str) -> bool:
        flag = getattr(self._obj, name, False)
        return False if callable(flag) else bool(flag)  # a method of that name is a tool, not the flag

    async def reset(self, sample: Sample) -> Reset:
        if self.run_in_thread and not inspect.iscoroutinefunction(self.factory):
            # one trip to a worker thread for construction and a sync reset (each trip costs)
            self._obj, observation, pending = await run_blocking(self._construct_and_reset, sample.row)
            if inspect.isawaitable(self._obj):
                self._obj = await self._obj
        else:
            self._obj, observation, pending = await self._run(self.factory), None, True
        obj_reset = getattr(self._obj, "reset", None)
        prompt = sample.prompt
        if callable(obj_reset):
            if pending:
                observation = await self._run(obj_reset, **_reset_kwargs(obj_reset, sample.row))
            text, images = observation or "", ()
            if observation is not None and not isinstance(observation, str):
                text, images = _render_result(observation)  # images, alone or with text (as a tool's)
            if observation is not None and not isinstance(observation, str) and not images:
                raise EnvironmentError_(
                    f"{type(self._obj).__name__}.reset() must return a str or None (or images, alone or with "
                    f"text), got {type(observation).__name__}"
                )
            if text or images:
                prompt = append_to_last_user(prompt, text, images)
        self.tools = discover_tools(self._obj)
        return Reset(prompt=prompt, tools=_schemas(type(self._obj), self.tools))

    def _construct_and_reset(self, row: Mapping[str, Any]) -> tuple[Any, Any, bool]:
        """In a worker thread: (the object, what a sync reset returned, whether reset is pending)."""
        obj = call_user(self.factory)
        if inspect.isawaitable(obj):  # a sync callable returning a coroutine: awaited by the caller
            return obj, None, True
        reset = getattr(obj, "reset", None)
        if not callable(reset) or inspect.iscoroutinefunction(reset):
            return obj, None, True
        return obj, call_user(reset, **_reset_kwargs(reset, row)), False

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self._obj is None:
            raise EnvironmentError_("step() was called before a successful reset()")
        if not conversation or conversation[-1].role != "assistant":
            role = conversation[-1].role if conversation else "nothing"
            raise EnvironmentError_(f"step() needs the conversation to end with an assistant message, not {role}")
        calls = conversation[-1].tool_calls
        if not calls or self._done():
            return Step(terminated=True)
        messages: list[Message] = []
        failures: list[Failure] = []
        for call in calls:
            message, failure = await self._execute(call)
            messages.append(replace(message, tool_call_id=call.id))
            if failure is not None:
                failures.append(failure)
            if self._done():
                break  # the remaining calls of this message are not run
        done = self._done()
        truncated = done and self._flag("truncated")
        return Step(
            messages=tuple(messages), terminated=done and not truncated, truncated=truncated, failures=tuple(failures)
        )

    async def _execute(self, call: ToolCall) -> tuple[Message, Failure | None]:
        if call.error is not None:
            return _error(call.name or None, "tool_invalid_json", call.error)
        tool = self.tools.get(call.name)
        if tool is None:
            available = ", ".join(self.tools) if self.tools else "none"
            message = f"unknown tool {call.name!r}; available tools: {available}"
            return _error(call.name, "tool_unknown", message)
        try:
            kwargs = validate_arguments(tool, call.arguments)
        except ToolArgumentError as exc:
            return _error(tool.name, "tool_bad_arguments", str(exc))
        try:  # the tool's own failure is reported to the model, not raised
            with boundary("tool", None):
                result = await self._run(tool.function, **kwargs)
        except EpisodeFailed as failed:
            return _error(tool.name, failed.failure.kind, failed.failure.message)
        content, images = _render_result(result)
        return Message(role="tool", content=content, name=tool.name, images=images), None

    async def finish(self) -> float:
        get_reward = getattr(self._obj, "get_reward", None) if self._obj is not None else None
        if not callable(get_reward):
            return 0.0
        value = await self._run(get_reward)
        try:  # strings are not rewards even when float() could read them
            reward = None if isinstance(value, (str, bytes)) else float(value)
        except (TypeError, ValueError):
            reward = None
        if reward is None or not math.isfinite(reward):
            owner = type(self._obj).__name__
            raise EnvironmentError_(f"{owner}.get_reward() must return a finite number, got {value!r}")
        return reward

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        close = getattr(self._obj, "close", None)
        if self._obj is not None and callable(close):
            await self._run(close)


def _reset_kwargs(reset: Callable[..., Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The row columns ``reset`` receives: all but ``prompt``, or only those it names."""
    columns = {k: v for k, v in row.items() if k != "prompt"}
    function = getattr(reset, "__func__", None)  # a bound method: inspect its function, minus self
    accepted, required = _reset_parameters(function or reset, function is not None)
    if accepted is None:
        return columns
    missing = [name for name in required if name not in columns]
    if missing:
        raise ConfigError(
            f"reset() needs the column(s) {', '.join(missing)}, which the row does not have "
            f"(row columns: {', '.join(columns) or 'none'})"
        )
    return {k: v for k, v in columns.items() if k in accepted}


#: Tool schemas per environment class: they depend on the class only, and sharing one tuple lets
#: the engine reuse what it derives from it (the fallback tool prompt) across episodes.
_SCHEMAS: "weakref.WeakKeyDictionary[type, tuple[dict[str, Any], ...]]" = weakref.WeakKeyDictionary()


def _schemas(cls: type, tools: Mapping[str, Tool]) -> tuple[dict[str, Any], ...]:
    schemas = _SCHEMAS.get(cls)
    if schemas is None or [s["function"]["name"] for s in schemas] != list(tools):
        schemas = _SCHEMAS[cls] = tuple(tool.schema() for tool in tools.values())
    return schemas


@functools.lru_cache(maxsize=256)
def _reset_parameters(reset: Callable[..., Any], bound: bool) -> tuple[frozenset[str] | None, tuple[str, ...]]:
    """(names ``reset`` accepts, or None when it takes ``**kwargs``; names it requires), computed
    once per function: signatures are slow to inspect and every episode resets."""
    try:
        parameters = list(inspect.signature(reset).parameters.values())
    except (TypeError, ValueError):
        return None, ()
    if bound:
        parameters = parameters[1:]
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None, ()
    accepted = frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return accepted, tuple(p.name for p in parameters if p.name in accepted and p.default is p.empty)


def _error(name: str | None, kind: FailureKind, message: str) -> tuple[Message, Failure]:
    return Message(role="tool", content=f"Error: {message}", name=name), Failure(kind=kind, message=message)


def _block(item: Any) -> tuple[str, Any] | None:
    """("image", image) or ("text", str) for an image, an image block or a text block; else None."""
    if is_image(item):
        return "image", item
    if not isinstance(item, Mapping) or item.get("type") not in ("image", "text"):
        return None
    if item["type"] == "text":
        return "text", str(item.get("text", ""))
    image = item.get("image")
    if image is None and isinstance(item.get("data", item.get("base64")), str):
        try:
            image = base64.b64decode(item.get("data", item.get("base64")), validate=True)
        except (binascii.Error, ValueError):
            raise EnvironmentError_("an image block's data is not valid base64") from None
    if not (is_image(image) or isinstance(image, (bytes, bytearray))):
        raise EnvironmentError_(
            f"an image block needs 'image' (a PIL image or bytes) or base64 'data', got keys {sorted(item)}"
        )
    return "image", bytes(image) if isinstance(image, bytearray) else image


def _render_result(result: Any) -> tuple[str, tuple[Any, ...]]:
    """A tool's return value as tool-message content and images."""
    if result is None:
        return "", ()
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    blocks = [_block(item) for item in items]
    if not any(block is not None and block[0] == "image" for block in blocks):
        return _text(result), ()
    texts = [
        block[1] if block is not None else _text(item)
        for item, block in zip(items, blocks)
        if block is None or block[0] == "text"
    ]
    return "\n".join(texts), tuple(block[1] for block in blocks if block is not None and block[0] == "image")


def _text(value: Any) -> str:
    """A tool result as text: a string as it is, anything else as JSON (``str`` for what JSON
    cannot hold), so that ``{"ok": True}`` reaches the model as ``{"ok": true}``."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:  # a circular structure: still readable as str
        return str(value)
