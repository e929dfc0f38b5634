"""Parsing tool calls out of generated text, one parser per model family.

Design: the engine keeps an assistant message's raw text as its content (so the conversation
re-renders to exactly the tokens the policy produced) and asks a ``ToolCallParser`` for the calls
written in it. A parser never raises on model output: a call it cannot read becomes a
``ToolCall(name=..., arguments={}, error=...)`` that the environment reports back to the model as a
counted failure. Parsers are stateless and cheap; ``get_parser(name)`` returns one by family name.

Each parser also writes the fallback system prompt for chat templates that ignore ``tools=``
(SmolLM2's ChatML does): the tools, the exact call format with an example, and the instruction to
answer without a tool call when done.

Families:

- ``hermes`` (alias ``qwen``, the default): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number per message. An unterminated final ``<tool_call>`` (generation stopped before the
  closing tag) counts when a JSON object follows it; when none does, it is reported as an error
  call rather than ignored, because the model did try to call a tool.
- ``llama3_json``: the whole message is one JSON object ``{"name": ..., "parameters": {...}}``
  (``arguments`` is accepted too). A JSON object with neither a name nor parameters is an answer,
  not a call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ..errors import ConfigError
from ..types import ToolCall

_DONE = "When you are done, answer without a tool call."
# Special-token text a decoder may leave after the call (``<|im_end|>``, ``<|eot_id|>``, ``</s>``).
_TRAILING_SPECIAL = re.compile(r"^(?:\s|<\|[A-Za-z0-9_]+\|>|</s>)*$")


@runtime_checkable
class ToolCallParser(Protocol):
    """Reads the tool calls of one model family out of generated text."""

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        """The calls in ``text``, in order; unreadable calls carry ``error``. Never raises."""
        ...

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """Instructions describing ``tools`` (OpenAI function format) and the call format."""
        ...


# --- shared decoding ---


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _json_error(exc: json.JSONDecodeError) -> str:
    # Some messages already end in "at" ("Unterminated string starting at").
    return f"{exc.msg.removesuffix(' at')} at char {exc.pos}"


def _broken(message: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments={}, error=message)


def _call_from_object(data: Any, argument_keys: tuple[str, ...]) -> ToolCall:
    """Turn a decoded JSON value into a call; ``argument_keys`` are the accepted argument fields."""
    if not isinstance(data, dict):
        expected = f'a JSON object with "name" and "{argument_keys[0]}"'
        return _broken(f"a tool call must be {expected}, got {_json_type(data)}")
    name = data.get("name")
    if name is None:
        return _broken('tool call is missing "name"')
    if not isinstance(name, str) or not name.strip():
        return _broken(f'tool call "name" must be a non-empty string, got {json.dumps(name)}')
    key = next((k for k in argument_keys if k in data), argument_keys[0])
    arguments = data.get(key)
    if isinstance(arguments, str):
        # Some models (and the OpenAI wire format) send the arguments as a JSON-encoded string.
        if not arguments.strip():
            arguments = None
        else:
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                problem = f'"{key}" of tool call {name} is a string but not valid JSON'
                return _broken(f"{problem}: {_json_error(exc)}", name)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _broken(
            f'"{key}" of tool call {name} must be a JSON object, got {_json_type(arguments)}', name
        )
    call_id = data.get("id")
    return ToolCall(name=name, arguments=arguments, id=call_id if isinstance(call_id, str) else None)


def _decode_prefix(payload: str) -> tuple[Any, str]:
    """Decode the JSON value at the start of ``payload``; return it and the text after it."""
    payload = payload.lstrip()
    value, end = json.JSONDecoder().raw_decode(payload)
    return value, payload[end:]


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Accept tools in the OpenAI format (``{"type": "function", "function": {...}}``) or bare."""
    functions = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ConfigError(f"a tool schema needs a function name, got {tool!r}")
        functions.append(function)
    return functions


def _tool_list(functions: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for function in functions:
        description = function.get("description") or "(no description)"
        parameters = function.get("parameters") or {"type": "object", "properties": {}, "required": []}
        lines.append(f"- {function['name']}: {description}")
        lines.append(f"  parameters: {_json(parameters)}")
    return "\n".join(lines)


def _example_value(schema: Mapping[str, Any]) -> Any:
    """A plausible value for a parameter schema, for the example call in the system prompt."""
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("anyOf"):
        return _example_value(schema["anyOf"][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(kind, "...")


def _example_arguments(function: Mapping[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or list(properties)[:1]
    return {name: _example_value(properties.get(name, {})) for name in required}


# --- families ---


class HermesParser:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, Qwen 2.5/3)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        if self.OPEN not in text:
            return ()
        calls: list[ToolCall] = []
        end = 0
        for block in self._BLOCK.finditer(text):
            calls.append(self._decode(block.group(1)))
            end = block.end()
        tail = text.find(self.OPEN, end)
        if tail != -1:
            calls.append(self._decode_unterminated(text[tail + len(self.OPEN):]))
        return tuple(calls)

    def _decode(self, payload: str) -> ToolCall:
        try:
            data = json.loads(payload)
        except json.JSONDecodeError as exc:
            return _broken(f"invalid JSON in <tool_call>: {_json_error(exc)}")
        return _call_from_object(data, ("arguments",))

    def _decode_unterminated(self, payload: str) -> ToolCall:
        try:
            data, rest = _decode_prefix(payload)
        except json.JSONDecodeError as exc:
            return _broken(f"invalid JSON in unterminated <tool_call>: {_json_error(exc)}")
        if not _TRAILING_SPECIAL.match(rest):
            return _broken(
                f"unterminated <tool_call>: text follows the JSON object; close it with {self.CLOSE}"
            )
        return _call_from_object(data, ("arguments",))

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = _tool_functions(tools)
        if not functions:
            return ""
        first = functions[0]
        example = _json({"name": first["name"], "arguments": _example_arguments(first)})
        return (
            "You can call the following tools:\n"
            f"{_tool_list(functions)}\n\n"
            f"To call a tool, write a JSON object with its \"name\" and its \"arguments\" between "
            f"{self.OPEN} and {self.CLOSE} tags, exactly like this:\n"
            f"{self.OPEN}\n{example}\n{self.CLOSE}\n"
            "You may call several tools in one message, one tag pair per call. Each result comes back "
            f"to you in a tool message. {_DONE}"
        )


class Llama3JsonParser:
    """The whole message is one JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.x)."""

    _PYTHON_TAG = "<|python_tag|>"
    _ARGUMENT_KEYS = ("parameters", "arguments")

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        body = text.strip()
        if body.startswith(self._PYTHON_TAG):
            body = body[len(self._PYTHON_TAG):].lstrip()
        if not body.startswith("{"):
            return ()
        try:
            data, rest = _decode_prefix(body)
        except json.JSONDecodeError as exc:
            return (_broken(f"invalid JSON in tool call: {_json_error(exc)}"),)
        if not _TRAILING_SPECIAL.match(rest):
            return ()  # JSON followed by prose: an answer that happens to start with an object
        if "name" not in data and not any(k in data for k in self._ARGUMENT_KEYS):
            return ()
        return (_call_from_object(data, self._ARGUMENT_KEYS),)

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = _tool_functions(tools)
        if not functions:
            return ""
        first = functions[0]
        example = _json({"name": first["name"], "parameters": _example_arguments(first)})
        return (
            "You can call the following tools:\n"
            f"{_tool_list(functions)}\n\n"
            "To call a tool, reply with only a JSON object with its \"name\" and its \"parameters\", "
            "and nothing else, exactly like this:\n"
            f"{example}\n"
            f"Call one tool per message. Each result comes back to you in a tool message. {_DONE}"
        )


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "llama3_json": Llama3JsonParser,
}

#: The names ``get_parser`` accepts.
PARSER_NAMES: tuple[str, ...] = tuple(sorted(_PARSERS))


def get_parser(name: str = "hermes") -> ToolCallParser:
    """The tool-call parser of a model family (see the module docstring)."""
    try:
        factory = _PARSERS[name]
    except (KeyError, TypeError):
        valid = ", ".join(PARSER_NAMES)
        raise ConfigError(f"unknown tool-call parser {name!r}; valid names: {valid}") from None
    return factory()
