"""Type hints of tool parameters compiled into type specs: one tree renders the JSON schema shown
to the model and checks and converts the arguments the model sends, so the two never disagree.

Design: ``compile_hint`` turns a resolved type hint into a small tree of ``TypeSpec`` nodes, one
frozen class per kind of hint; each node renders its JSON schema (``schema``) and checks and
converts one value (``convert``, raising ``ArgumentMismatch`` naming the argument). Pure stdlib.

Type hints map to JSON schema as follows::

    str -> string    int -> integer    float -> number (an int is accepted)    bool -> boolean
    list[X] -> array of X    dict[str, X] -> object of X    Any -> anything
    Literal["a", "b"] / enum.Enum subclass -> {"type": ..., "enum": [...]} (Enum members come back)
    Optional[X] / X | None -> X with "nullable": true    other unions -> "anyOf"

Strictness: ``bool`` is not an integer, an ``int`` is accepted (and converted) for ``float``, and
nothing is coerced from strings: ``"3"`` is not the integer 3. A ``float`` parameter takes only
finite numbers a double can hold: ``NaN``, infinities and integers too large for a float (``10**400``)
are the model's bad arguments, never an exception inside the environment. An unsupported hint is a
``ConfigError`` naming the parameter.
"""

from __future__ import annotations

import abc
import enum
import json
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from ..errors import ArgumentMismatch, ConfigError


def show_value(value: Any) -> str:
    """A value as the model wrote it (JSON where possible), cut to a readable length."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except (ValueError, RecursionError):  # an int past Python's digit limit, a cyclic container
            text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 80 else text[:77] + "..."


def _mismatch(where: str, expected: str, value: Any) -> ArgumentMismatch:
    shown = f"{show_value(value)} ({type(value).__name__})"
    return ArgumentMismatch(f"argument {where} must be {expected} but got {shown}")


# --- type specs: one small class per kind of hint, each renders a schema and converts a value ---


class TypeSpec(abc.ABC):
    """A compiled type hint: renders its JSON schema and checks (and converts) one value."""

    @property
    @abc.abstractmethod
    def expected(self) -> str:
        """How the type is named in error messages."""

    @abc.abstractmethod
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the type."""

    @abc.abstractmethod
    def convert(self, value: Any, where: str) -> Any:
        """The value to pass to the tool; raises ``ArgumentMismatch`` naming ``where`` if it does not fit."""


class AnySpec(TypeSpec):
    @property
    def expected(self) -> str:
        return "any value"

    def schema(self) -> dict[str, Any]:
        return {}

    def convert(self, value: Any, where: str) -> Any:
        return value


@dataclass(frozen=True)
class ScalarSpec(TypeSpec):
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


class NumberSpec(ScalarSpec):
    """``float``: an int or a float, converted to a finite float (``float(10**400)`` would raise
    ``OverflowError`` inside the environment; ``NaN`` would reach the tool)."""

    def convert(self, value: Any, where: str) -> Any:
        number = super().convert(value, where)
        try:
            number = float(number)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise _mismatch(where, "a finite number within a double's range (about ±1.8e308)", value)
        return number


_STRING = ScalarSpec("string", lambda v: isinstance(v, str))
_INTEGER = ScalarSpec("integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
_NUMBER = NumberSpec("number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))
_BOOLEAN = ScalarSpec("boolean", lambda v: isinstance(v, bool))
_NULL = ScalarSpec("null", lambda v: v is None)
_SCALARS: dict[Any, TypeSpec] = {str: _STRING, int: _INTEGER, float: _NUMBER, bool: _BOOLEAN, type(None): _NULL}


@dataclass(frozen=True)
class ArraySpec(TypeSpec):
    item: TypeSpec

    @property
    def expected(self) -> str:
        return "array" if isinstance(self.item, AnySpec) else f"array of {self.item.expected}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array"}
        if not isinstance(self.item, AnySpec):
            out["items"] = self.item.schema()
        return out

    def convert(self, value: Any, where: str) -> Any:
        if not isinstance(value, (list, tuple)):
            raise _mismatch(where, self.expected, value)
        return [self.item.convert(v, f"{where}[{i}]") for i, v in enumerate(value)]


@dataclass(frozen=True)
class ObjectSpec(TypeSpec):
    value: TypeSpec

    @property
    def expected(self) -> str:
        return "object" if isinstance(self.value, AnySpec) else f"object of {self.value.expected}"

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object"}
        if not isinstance(self.value, AnySpec):
            out["additionalProperties"] = self.value.schema()
        return out

    def convert(self, value: Any, where: str) -> Any:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _mismatch(where, "object", value)
        return {k: self.value.convert(v, f"{where}[{json.dumps(k)}]") for k, v in value.items()}


_JSON_TYPE_OF = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}


@dataclass(frozen=True)
class ChoiceSpec(TypeSpec):
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
        raise ArgumentMismatch(f"argument {where} must be {self.expected} but got {show_value(value)}")


@dataclass(frozen=True)
class NullableSpec(TypeSpec):
    inner: TypeSpec

    @property
    def expected(self) -> str:
        return f"{self.inner.expected} or null"

    def schema(self) -> dict[str, Any]:
        return {**self.inner.schema(), "nullable": True}

    def convert(self, value: Any, where: str) -> Any:
        return None if value is None else self.inner.convert(value, where)


@dataclass(frozen=True)
class UnionSpec(TypeSpec):
    options: tuple[TypeSpec, ...]

    @property
    def expected(self) -> str:
        return " or ".join(o.expected for o in self.options)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [o.schema() for o in self.options]}

    def convert(self, value: Any, where: str) -> Any:
        for option in self.options:  # first match wins, in the order the hint lists them
            try:
                return option.convert(value, where)
            except ArgumentMismatch:
                continue
        raise _mismatch(where, self.expected, value)


def compile_hint(hint: Any, where: str) -> TypeSpec:
    """Turn a resolved type hint into a spec; ``where`` names the parameter for errors."""
    if hint is Any:
        return AnySpec()
    if hint in _SCALARS:
        return _SCALARS[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = tuple(member.value for member in hint)
        if not values or any(type(v) not in _JSON_TYPE_OF for v in values):
            raise ConfigError(f"{where}: enum {hint.__name__} needs str, int, float or bool values, got {values!r}")
        return ChoiceSpec(values, enum_class=hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return ArraySpec(compile_hint(args[0], where) if args else AnySpec())
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise ConfigError(f"{where}: dict keys must be str (JSON object keys), got {hint}")
        return ObjectSpec(compile_hint(args[1], where) if args else AnySpec())
    if origin is Literal:
        if any(type(v) not in _JSON_TYPE_OF for v in args):
            raise ConfigError(f"{where}: Literal values must be str, int, float, bool or None, got {args!r}")
        return ChoiceSpec(tuple(args))
    if origin is typing.Union or origin is types.UnionType:
        options = tuple(compile_hint(a, where) for a in args if a is not type(None))
        inner = options[0] if len(options) == 1 else UnionSpec(options)
        return NullableSpec(inner) if type(None) in args else inner
    raise ConfigError(
        f"{where}: unsupported type hint {hint!r}; use str, int, float, bool, list[X], dict[str, X], "
        "Literal[...], an Enum, Optional[X] or Any"
    )
