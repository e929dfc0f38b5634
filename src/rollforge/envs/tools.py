"""Tool discovery for environment classes: JSON schemas from signatures, strict argument checks.

Design: every public method of an environment object is a tool, except the lifecycle methods
``reset``, ``get_reward`` and ``close`` (the factory adapter calls those itself) and anything that is
not a plain method (properties such as ``done``, data attributes, nested classes). Each signature is
compiled once, at discovery, into a small tree of type specs; the same tree renders the JSON schema
offered to the model (OpenAI function format) and checks and converts the arguments the model
sends, so the schema and the validation can never disagree. Pure stdlib, no jsonschema.

Type hints map to JSON schema as follows::

    str -> string    int -> integer    float -> number (an int is accepted)    bool -> boolean
    list[X] -> array of X    dict[str, X] -> object of X    Any -> anything
    Literal["a", "b"] / enum.Enum subclass -> {"type": ..., "enum": [...]} (Enum members come back)
    Optional[X] / X | None -> X with "nullable": true    other unions -> "anyOf"

Choices made for strictness:

- a parameter without a type hint is a ``ConfigError`` at discovery, naming the method and the
  parameter (write ``Any`` to accept anything on purpose); so are ``*args``, ``**kwargs`` and
  positional-only parameters, because tools are called with keyword arguments only;
- ``bool`` is not an integer, an ``int`` is accepted (and converted) for ``float``, and nothing is
  coerced from strings: ``"3"`` is not the integer 3;
- a parameter whose default is ``None`` accepts ``null`` even when its hint is not ``Optional``.

Arguments are passed to the tool as Python values; nothing is ever spliced into a string.
"""

from __future__ import annotations

import copy
import enum
import inspect
import json
import re
import types
import typing
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping, Sequence

from ..errors import ConfigError

#: Methods of an environment class that are part of its lifecycle, never offered as tools.
LIFECYCLE_METHODS = frozenset({"reset", "get_reward", "close"})


class ToolArgumentError(ConfigError):
    """The arguments of a tool call do not match the tool's signature. ``problems`` lists every
    mismatch found, each naming the argument, what was expected and what was given."""

    def __init__(self, tool: str, problems: Sequence[str]):
        self.tool = tool
        self.problems = tuple(problems)
        super().__init__(f"invalid arguments for tool {tool}: " + "; ".join(self.problems))


class _Mismatch(Exception):
    """Raised by a type spec when a value does not fit; caught by ``validate_arguments``."""


def _show(value: Any) -> str:
    """A value as the model wrote it (JSON where possible), cut to a readable length."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _mismatch(where: str, expected: str, value: Any) -> _Mismatch:
    return _Mismatch(f"argument {where} must be {expected} but got {_show(value)} ({type(value).__name__})")


# --- type specs: one small class per kind of hint, each renders a schema and converts a value ---


class _Spec:
    """A compiled type hint: renders its JSON schema and checks (and converts) one value."""

    @property
    def expected(self) -> str:
        """How the type is named in error messages."""
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError

    def convert(self, value: Any, where: str) -> Any:
        """The value to pass to the tool; raises ``_Mismatch`` naming ``where`` when it does not fit."""
        raise NotImplementedError


class _AnySpec(_Spec):
    @property
    def expected(self) -> str:
        return "any value"

    def schema(self) -> dict[str, Any]:
        return {}

    def convert(self, value: Any, where: str) -> Any:
        return value


@dataclass(frozen=True)
class _Scalar(_Spec):
    json_type: str
    accepts: Callable[[Any], bool]
    cast: Callable[[Any], Any] = lambda value: value

    @property
    def expected(self) -> str:
        return self.json_type

    def schema(self) -> dict[str, Any]:
        return {"type": self.json_type}

    def convert(self, value: Any, where: str) -> Any:
        if not self.accepts(value):
            raise _mismatch(where, self.json_type, value)
        return self.cast(value)


_STRING = _Scalar("string", lambda v: isinstance(v, str))
_INTEGER = _Scalar("integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
_NUMBER = _Scalar("number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), float)
_BOOLEAN = _Scalar("boolean", lambda v: isinstance(v, bool))
_NULL = _Scalar("null", lambda v: v is None)
_SCALARS: dict[Any, _Spec] = {str: _STRING, int: _INTEGER, float: _NUMBER, bool: _BOOLEAN, type(None): _NULL}


@dataclass(frozen=True)
class _Array(_Spec):
    item: _Spec

    @property
    def expected(self) -> str:
        return "array" if isinstance(self.item, _AnySpec) else f"array of {self.item.expected}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        if not isinstance(self.item, _AnySpec):
            out["items"] = self.item.schema()
        return out

    def convert(self, value: Any, where: str) -> Any:
        if not isinstance(value, (list, tuple)):
            raise _mismatch(where, self.expected, value)
        return [self.item.convert(v, f"{where}[{i}]") for i, v in enumerate(value)]


@dataclass(frozen=True)
class _Object(_Spec):
    value: _Spec

    @property
    def expected(self) -> str:
        return "object" if isinstance(self.value, _AnySpec) else f"object of {self.value.expected}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if not isinstance(self.value, _AnySpec):
            out["additionalProperties"] = self.value.schema()
        return out

    def convert(self, value: Any, where: str) -> Any:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _mismatch(where, "object", value)
        return {k: self.value.convert(v, f"{where}[{json.dumps(k)}]") for k, v in value.items()}


_JSON_TYPE_OF = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}


@dataclass(frozen=True)
class _Choice(_Spec):
    """``Literal[...]`` or an ``Enum``: the value must equal one of ``values`` with the same type
    (so ``True`` is not ``1``); an Enum converts the value back to its member."""

    values: tuple[Any, ...]
    enum_class: type[enum.Enum] | None = None

    @property
    def expected(self) -> str:
        return "one of " + json.dumps(list(self.values), separators=(",", ":"), ensure_ascii=False)

    def schema(self) -> dict[str, Any]:
        json_types = list(dict.fromkeys(_JSON_TYPE_OF[type(v)] for v in self.values))
        return {"type": json_types[0] if len(json_types) == 1 else json_types, "enum": list(self.values)}

    def convert(self, value: Any, where: str) -> Any:
        if self.enum_class is not None and isinstance(value, self.enum_class):
            return value
        for allowed in self.values:
            same_type = type(value) is type(allowed) or (
                isinstance(allowed, float) and type(value) is int  # 1 for 1.0, as for plain floats
            )
            if same_type and value == allowed:
                return self.enum_class(allowed) if self.enum_class is not None else allowed
        raise _Mismatch(f"argument {where} must be {self.expected} but got {_show(value)}")


@dataclass(frozen=True)
class _Nullable(_Spec):
    inner: _Spec

    @property
    def expected(self) -> str:
        return f"{self.inner.expected} or null"

    def schema(self) -> dict[str, Any]:
        return {**self.inner.schema(), "nullable": True}

    def convert(self, value: Any, where: str) -> Any:
        return None if value is None else self.inner.convert(value, where)


@dataclass(frozen=True)
class _Union(_Spec):
    options: tuple[_Spec, ...]

    @property
    def expected(self) -> str:
        return " or ".join(o.expected for o in self.options)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [o.schema() for o in self.options]}

    def convert(self, value: Any, where: str) -> Any:
        for option in self.options:  # first match wins, in the order the hint lists them
            try:
                return option.convert(value, where)
            except _Mismatch:
                continue
        raise _mismatch(where, self.expected, value)


def _compile(hint: Any, where: str) -> _Spec:
    """Turn a resolved type hint into a spec; ``where`` names the parameter for errors."""
    if hint is Any:
        return _AnySpec()
    if hint in _SCALARS:
        return _SCALARS[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = tuple(member.value for member in hint)
        if not values or any(type(v) not in _JSON_TYPE_OF for v in values):
            raise ConfigError(
                f"{where}: enum {hint.__name__} needs str, int, float or bool values, got {values!r}"
            )
        return _Choice(values, enum_class=hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return _Array(_compile(args[0], where) if args else _AnySpec())
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise ConfigError(f"{where}: dict keys must be str (JSON object keys), got {hint}")
        return _Object(_compile(args[1], where) if args else _AnySpec())
    if origin is Literal:
        if any(type(v) not in _JSON_TYPE_OF for v in args):
            raise ConfigError(f"{where}: Literal values must be str, int, float, bool or None, got {args!r}")
        return _Choice(tuple(args))
    if origin is typing.Union or origin is types.UnionType:
        options = tuple(_compile(a, where) for a in args if a is not type(None))
        inner = options[0] if len(options) == 1 else _Union(options)
        return _Nullable(inner) if type(None) in args else inner
    raise ConfigError(
        f"{where}: unsupported type hint {hint!r}; use str, int, float, bool, list[X], dict[str, X], "
        "Literal[...], an Enum, Optional[X] or Any"
    )


# --- docstrings ---

_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_ARG_SECTIONS = {"Args", "Arguments", "Parameters", "Params"}


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description (the text before the first section,
    paragraphs kept) and the per-argument descriptions of its ``Args:`` section."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, entry_indent, current = header.group(1), None, None
            continue
        if section is None:
            summary.append(line.strip())
            continue
        if section not in _ARG_SECTIONS or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if entry_indent is None:
            entry_indent = indent
        entry = _ARG_LINE.match(line.strip()) if indent <= entry_indent else None
        if entry:
            current = entry.group(1)
            args[current] = entry.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    paragraphs = re.split(r"\n\s*\n", "\n".join(summary))
    description = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    return description, args


# --- tools ---


@dataclass(frozen=True)
class ParameterSpec:
    """One tool parameter: its schema and how to check a value for it."""

    name: str
    description: str
    required: bool
    default: Any
    type_spec: _Spec = field(repr=False)

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
            raise ConfigError(
                f"{where}: *args and **kwargs cannot be described to the model; name each argument"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise ConfigError(
                f"{where}: positional-only parameters are not supported; tools get keyword arguments"
            )
        if param.name not in hints:
            raise ConfigError(f"{where} has no type hint; annotate it (use typing.Any to accept any value)")
        type_spec = _compile(hints[param.name], where)
        required = param.default is param.empty
        if not required and param.default is None and not isinstance(type_spec, (_Nullable, _AnySpec)):
            type_spec = _Nullable(type_spec)
        doc = arg_docs.get(param.name, "")
        spec.append(ParameterSpec(param.name, doc, required, param.default, type_spec))
    parameters = {
        "type": "object",
        "properties": {p.name: p.schema() for p in spec},
        "required": [p.name for p in spec if p.required],
    }
    return Tool(name, description, parameters, function, tuple(spec))


def discover_tools(obj: Any) -> dict[str, Tool]:
    """The tools of an environment object, keyed by name, in definition order (subclass first)."""
    tools: dict[str, Tool] = {}
    seen: set[str] = set()
    for klass in type(obj).__mro__:
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if name in seen:
                continue
            seen.add(name)
            if name.startswith("_") or name in LIFECYCLE_METHODS:
                continue
            if inspect.isfunction(raw) or isinstance(raw, (staticmethod, classmethod)):
                bound = getattr(obj, name)
                if not inspect.isfunction(raw):  # static/class methods: rare, compiled each time
                    tools[name] = tool_from_callable(bound, name)
                    continue
                compiled = _COMPILED.get(raw)
                if compiled is None:  # a schema depends on the class only: compile once per method
                    compiled = _COMPILED[raw] = tool_from_callable(bound, name)
                tools[name] = replace(compiled, function=bound)
    return tools


#: Compiled tools per class attribute (the function object); weak so classes can be collected.
_COMPILED: "weakref.WeakKeyDictionary[Any, Tool]" = weakref.WeakKeyDictionary()


def validate_arguments(tool: Tool, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``arguments`` against the tool's parameters and return the keyword arguments to call
    it with (floats widened, Enum members restored; omitted defaults left to Python). Raises
    ``ToolArgumentError`` listing every problem."""
    if not isinstance(arguments, Mapping):
        shown = f"{_show(arguments)} ({type(arguments).__name__})"
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
        except _Mismatch as exc:
            problems.append(str(exc))
    if problems:
        raise ToolArgumentError(tool.name, problems)
    return kwargs
