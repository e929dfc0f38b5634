"""Tool discovery for environment classes: JSON schemas from signatures, strict argument checks.

Design: every public method of an environment object is a tool, except the lifecycle methods
``reset``, ``get_reward`` and ``close`` (the factory adapter calls those itself) and anything that is
not a plain method (properties such as ``done``, data attributes, nested classes). Each signature is
compiled once, at discovery, into type specs (``envs/argtypes.py``, which also lists how hints
map to JSON schema); the same specs render the JSON schema offered to the model (OpenAI
function format) and check and convert the arguments the model sends, so the schema and the
validation can never disagree. Descriptions come from Google-style docstrings
(``envs/docstrings.py``). Pure stdlib, no jsonschema.

Choices made for strictness:

- a parameter without a type hint is a ``ConfigError`` at discovery, naming the method and the
  parameter (write ``Any`` to accept anything on purpose); so are ``*args``, ``**kwargs`` and
  positional-only parameters, because tools are called with keyword arguments only;
- a parameter whose default is ``None`` accepts ``null`` even when its hint is not ``Optional``;
- ``validate_arguments`` reports every problem of a call at once, in one ``ToolArgumentError``.

Arguments are passed to the tool as Python values; nothing is ever spliced into a string.
"""

from __future__ import annotations

import copy
import enum
import inspect
import json
import typing
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from ..errors import ArgumentMismatch, ConfigError, ToolArgumentError
from .argtypes import AnySpec, NullableSpec, TypeSpec, compile_hint, show_value
from .docstrings import parse_docstring

#: Methods of an environment class that are part of its lifecycle, never offered as tools.
LIFECYCLE_METHODS = frozenset({"reset", "get_reward", "close"})


@dataclass(frozen=True)
class ParameterSpec:
    """One tool parameter: its schema and how to check a value for it."""

    name: str
    description: str
    required: bool
    default: Any
    type_spec: TypeSpec = field(repr=False)

    def schema(self) -> dict[str, Any]:
        out = self.type_spec.schema()
        if self.description:
            out["description"] = self.description
        if not self.required and _is_json_value(self.default):
            default = self.default.value if isinstance(self.default, enum.Enum) else self.default
            out["default"] = copy.deepcopy(default)
        return out


def _is_json_value(value: Any) -> bool:
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Tool:
    """A callable offered to the model: ``parameters`` is its JSON schema (an object schema),
    ``function`` the bound callable, ``spec`` the compiled parameters used for validation."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: Callable[..., Any] = field(repr=False, compare=False)
    spec: tuple[ParameterSpec, ...] = field(default=(), repr=False)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def schema(self) -> dict[str, Any]:
        """The tool in the OpenAI function format that chat templates take as ``tools=``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(dict(self.parameters)),
            },
        }


def tool_from_callable(function: Callable[..., Any], name: str | None = None) -> Tool:
    """Build a ``Tool`` from a function or bound method (see the module docstring for the rules)."""
    name = name or function.__name__
    qualname = getattr(function, "__qualname__", name)
    try:
        hints = typing.get_type_hints(inspect.unwrap(getattr(function, "__func__", function)))
    except Exception as exc:  # NameError for unresolvable forward references, TypeError for odd hints
        raise ConfigError(f"cannot resolve the type hints of tool {qualname}: {exc}") from exc
    description, arg_docs = parse_docstring(inspect.getdoc(function))
    spec: list[ParameterSpec] = []
    for param in inspect.signature(function).parameters.values():
        where = f"tool {qualname}, parameter {param.name}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"{where}: *args and **kwargs cannot be described to the model; name each argument")
        if param.kind is param.POSITIONAL_ONLY:
            raise ConfigError(f"{where}: positional-only parameters are not supported; tools get keyword arguments")
        if param.name not in hints:
            raise ConfigError(f"{where} has no type hint; annotate it (use typing.Any to accept any value)")
        type_spec = compile_hint(hints[param.name], where)
        required = param.default is param.empty
        if not required and param.default is None and not isinstance(type_spec, (NullableSpec, AnySpec)):
            type_spec = NullableSpec(type_spec)
        doc = arg_docs.get(param.name, "")
        spec.append(ParameterSpec(param.name, doc, required, param.default, type_spec))
    parameters = {
        "type": "object",
        "properties": {p.name: p.schema() for p in spec},
        "required": [p.name for p in spec if p.required],
    }
    return Tool(name, description, parameters, function, tuple(spec))


#: Compiled tools per class attribute (the function object); weak so classes can be collected.
_COMPILED: "weakref.WeakKeyDictionary[Any, Tool]" = weakref.WeakKeyDictionary()


def discover_tools(obj: Any) -> dict[str, Tool]:
    """The tools of an environment object, keyed by name, in definition order (subclass first)."""
    return _discover(type(obj), obj)


def class_tools(klass: type) -> dict[str, Tool]:
    """The tools every instance of ``klass`` offers, found without making one (the start-up checks
    measure prompts with their schemas). Their functions are bound to a placeholder: never call them."""
    return _discover(klass, _PLACEHOLDER)


_PLACEHOLDER = object()


def _discover(klass: type, obj: Any) -> dict[str, Tool]:
    tools: dict[str, Tool] = {}
    seen: set[str] = set()
    for owner in klass.__mro__:
        if owner is object:
            continue
        for name, raw in vars(owner).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_") or name in LIFECYCLE_METHODS:
                continue
            if inspect.isfunction(raw) or isinstance(raw, (staticmethod, classmethod)):
                bound = raw.__get__(obj, klass) if obj is _PLACEHOLDER else getattr(obj, name)
                if not inspect.isfunction(raw):  # static/class methods: rare, compiled each time
                    tools[name] = tool_from_callable(bound, name)
                    continue
                compiled = _COMPILED.get(raw)
                if compiled is None:  # a schema depends on the class only: compile once per method
                    compiled = _COMPILED[raw] = tool_from_callable(bound, name)
                tools[name] = replace(compiled, function=bound)
    return tools


def validate_arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``arguments`` against the tool's parameters and return the keyword arguments to call
    it with (floats widened, Enum members restored; omitted defaults left to Python). Raises
    ``ToolArgumentError`` listing every problem."""
    if not isinstance(arguments, Mapping):
        shown = f"{show_value(arguments)} ({type(arguments).__name__})"
        raise ToolArgumentError(tool.name, [f"arguments must be a JSON object but got {shown}"])
    known = {p.name: p for p in tool.spec}
    problems: list[str] = []
    unexpected = [str(k) for k in arguments if k not in known]
    if unexpected:
        valid = ", ".join(known) if known else "none, this tool takes no arguments"
        noun = "argument" if len(unexpected) == 1 else "arguments"
        problems.append(f"unexpected {noun} {', '.join(unexpected)} (valid arguments: {valid})")
    kwargs: dict[str, Any] = {}
    for param in tool.spec:
        if param.name not in arguments:
            if param.required:
                problems.append(f"missing required argument {param.name}")
            continue
        try:
            kwargs[param.name] = param.type_spec.convert(arguments[param.name], param.name)
        except ArgumentMismatch as exc:
            problems.append(str(exc))
    if problems:
        raise ToolArgumentError(tool.name, problems)
    return kwargs
