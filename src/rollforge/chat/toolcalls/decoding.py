"""What every parser shares: strict JSON decoding, turning JSON into a ``ToolCall``, linear scanning.

Strict JSON: model output is decoded with Python's C decoder, but nothing a model can write makes
it raise past the parser or produce a value the rest of rollforge cannot carry. ``NaN``,
``Infinity``, ``-Infinity`` and numbers that overflow a double (``1e999``) are rejected (they would
reach tools as non-finite floats and make trajectory JSON non-standard); integers longer than
Python's digit limit (``ValueError``), nesting deeper than ``MAX_DEPTH`` (a ``RecursionError`` in
the decoder, or later in a template's ``tojson``) and lone UTF-16 surrogates (text no tokenizer can
encode) are rejected too. Every rejection is a ``BadJSON`` whose message the parser puts on an
error ``ToolCall``, so the environment reports it to the model as a counted failure.

Linear scanning: ``Scanner.find`` caches, per needle, the next occurrence at or after the last
search, so a parser that looks for several closing markers from many positions (the usual source
of quadratic time on adversarial output, e.g. thousands of unclosed ``<tool_call>`` tags) reads the
text once per needle.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ...errors import BadJSON
from ...types import ToolCall

#: Deepest nesting of objects and arrays accepted in tool arguments (real calls use a handful).
MAX_DEPTH = 64
#: Most calls read from one reply; the rest become one error call. Real replies hold a few; a reply
#: with thousands of call markers would otherwise cost thousands of tool runs and tool messages.
MAX_CALLS = 128

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_NOT_A_WORD = re.compile(r"[\s<>\[\]{}\ud800-\udfff]")
# Special-token text a decoder may leave after the call (``<|im_end|>``, ``<|eot_id|>``, ``</s>``,
# DeepSeek's ``<｜end▁of▁sentence｜>``).
_TRAILING_SPECIAL = re.compile(r"(?:\s|<\|[A-Za-z0-9_]{1,40}\|>|<｜[^｜<>]{1,40}｜>|</s>)*")
# A "name": "..." pair, to keep the tool name on a call whose JSON is broken.
_NAME_FIELD = re.compile(r'"name"\s*:\s*"([A-Za-z0-9_.:\-]{1,128})"')


def _reject_constant(name: str) -> Any:
    raise BadJSON(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        shown = literal if len(literal) <= 40 else literal[:37] + "..."
        raise BadJSON(f"number {shown} is out of range for a double")
    return value


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_reject_constant)


def decode_prefix(text: str, start: int = 0) -> tuple[Any, int]:
    """Decode the strict JSON value at ``text[start:]`` (after whitespace); return it and where it
    ends. Raises ``BadJSON`` (never anything else) with a position counted from ``start``."""
    at = start
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    try:
        value, end = _DECODER.raw_decode(text, at)
    except json.JSONDecodeError as exc:
        # Some messages already end in "at" ("Unterminated string starting at").
        raise BadJSON(f"{exc.msg.removesuffix(' at')} at char {exc.pos - start}") from None
    except BadJSON:
        raise
    except RecursionError:
        raise BadJSON(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # an integer past Python's int digit limit
        raise BadJSON(f"unreadable number: {str(exc)[:120]}") from None
    _check_value(value)
    return value, end


def loads(text: str) -> Any:
    """Decode ``text`` as exactly one strict JSON value (surrounding whitespace allowed)."""
    value, end = decode_prefix(text)
    if text[end:].strip():
        raise BadJSON(f"Extra data at char {end}")
    return value


def _check_value(value: Any) -> None:
    """Reject nesting deeper than ``MAX_DEPTH`` and strings holding lone surrogates (iteratively:
    the value may be as deep as the decoder allowed)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise BadJSON("string holds a lone UTF-16 surrogate")
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise BadJSON(f"JSON nested more than {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)


def only_trailing_special(text: str, start: int = 0, close: str = "") -> bool:
    """Whether ``text[start:]`` is only whitespace and special-token text, optionally after the
    beginning of ``close`` (a generation cut inside the closing tag, e.g. ``</tool_call``)."""
    rest = text[start:].lstrip()
    if _TRAILING_SPECIAL.fullmatch(rest) is not None:
        return True
    cut = next((k for k in range(len(close), 0, -1) if rest.startswith(close[:k])), 0)
    return cut > 0 and _TRAILING_SPECIAL.fullmatch(rest, cut) is not None


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def broken(message: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments={}, error=message)


def full(calls: list[ToolCall]) -> bool:
    """Whether ``calls`` holds ``MAX_CALLS``; if so, the error call saying so is appended once."""
    if len(calls) < MAX_CALLS:
        return False
    if len(calls) == MAX_CALLS:
        calls.append(broken(f"more than {MAX_CALLS} tool calls in one reply; the rest were not read"))
    return True


def salvage_name(payload: str) -> str:
    """The tool name written in broken JSON, when a ``"name": "..."`` pair is readable."""
    match = _NAME_FIELD.search(payload, 0, 4096)
    return match.group(1) if match else ""


def valid_name(name: Any, word: bool = False) -> str | None:
    """Why ``name`` cannot be a tool name, or None when it can. ``word``: the format delimits the
    name by text, not by JSON quotes, so it must also be one word without markup."""
    if not isinstance(name, str) or not name.strip():
        return f"must be a non-empty string, got {json.dumps(name)[:80]}"
    if word and (len(name) > 256 or _NOT_A_WORD.search(name)):
        shown = json.dumps(name[:80])
        return f"must be one word without spaces or markup, got {shown}{'...' if len(name) > 80 else ''}"
    return None


def arguments_object(arguments: Any, key: str, name: str) -> dict[str, Any] | ToolCall:
    """The arguments of call ``name`` as a dict: ``null``/absent/blank mean no arguments; a string is
    decoded as JSON (the OpenAI wire format sends arguments that way). Else an error call."""
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = loads(arguments)
        except BadJSON as exc:
            return broken(f'"{key}" of tool call {name} is a string but not valid JSON: {exc}', name)
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        return broken(f'"{key}" of tool call {name} must be a JSON object, got {json_type(arguments)}', name)
    return arguments


def call_from_object(data: Any, argument_keys: tuple[str, ...] = ("arguments",)) -> ToolCall:
    """Turn a decoded ``{"name": ..., "arguments": {...}, "id"?: ...}`` into a call;
    ``argument_keys`` are the accepted names of the arguments field, the first one preferred."""
    if not isinstance(data, dict):
        expected = f'a JSON object with "name" and "{argument_keys[0]}"'
        return broken(f"a tool call must be {expected}, got {json_type(data)}")
    name = data.get("name")
    if name is None:
        return broken('tool call is missing "name"')
    problem = valid_name(name)
    if problem is not None:
        return broken(f'tool call "name" {problem}')
    key = next((k for k in argument_keys if k in data), argument_keys[0])
    arguments = arguments_object(data.get(key), key, name)
    if isinstance(arguments, ToolCall):
        return arguments
    call_id = data.get("id")
    return ToolCall(name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else None)


class Scanner:
    """``str.find`` over one text that remembers, per needle, the next occurrence it found, so that
    searching for the same needle again from a later position costs nothing until it is passed.
    Positions only move forward: a search from before an earlier one may miss occurrences.
    """

    __slots__ = ("text", "_next")

    def __init__(self, text: str):
        self.text = text
        self._next: dict[str, int] = {}

    def find(self, needle: str, start: int) -> int:
        """The first index >= ``start`` where ``needle`` occurs, or -1."""
        found = self._next.get(needle)
        if found is None or (found != -1 and found < start):
            found = self.text.find(needle, start)
            self._next[needle] = found
        return found

    def first(self, needles: tuple[str, ...], start: int) -> tuple[int, str]:
        """The earliest occurrence at or after ``start`` of any of ``needles``: (index, needle), or
        (-1, "") when none occurs."""
        best, which = -1, ""
        for needle in needles:
            at = self.find(needle, start)
            if at != -1 and (best == -1 or at < best):
                best, which = at, needle
        return best, which
