"""Qwen3-Coder XML tool calls.

``<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>``,
any number of ``<tool_call>`` blocks, each with one or more functions (a bare ``<function=...>``
without the wrapper is read too, as Qwen's own parser does). As in Qwen's published parser, one
newline after ``<parameter=ARG>`` and one before ``</parameter>`` belong to the markup, and a value
runs to ``</parameter>``, the next ``<parameter=`` or ``</function>``, whichever comes first (a
model that forgets a closing tag still gets its call run).

Values are text in this format; Qwen's parser converts each one by the type the tool's schema
declares for it. ``parse`` is given text only, so this parser does the same when it is built
with the tools (``Qwen3CoderParser(tools)``) and otherwise decodes a value as strict JSON when it
is a JSON number, ``true``/``false``/``null``, an object or an array, and keeps it as a string
otherwise. Without the schema a string parameter whose value looks like a number (``"42"``)
therefore arrives as a number and fails validation as a counted ``tool_bad_arguments``.
Unreadable numbers (``NaN``, ``1e999``, 5,000 digits) stay strings and fail validation the same way.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ...types import ToolCall
from .decoding import BadJSON, Scanner, broken, full, loads, valid_name
from ._prompt import DONE, example_arguments, parameters_of, tool_functions

_JSON_START = frozenset('{["-0123456789tfn')


class Qwen3CoderParser:
    """``<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>``."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    FUNCTION, FUNCTION_END = "<function=", "</function>"
    PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"
    #: Text whose presence means the reply tried to call a tool.
    markers: tuple[str, ...] = (OPEN, FUNCTION)

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()):
        #: Parameter types per tool name, from the schemas (empty: decode values by their text).
        self._types: dict[str, dict[str, Any]] = {
            f["name"]: {k: v.get("type") for k, v in (parameters_of(f).get("properties") or {}).items()}
            for f in tool_functions(tools)
        }

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        if self.FUNCTION not in text and self.OPEN not in text:
            return ()
        scan = Scanner(text)
        calls: list[ToolCall] = []
        start = scan.find(self.OPEN, 0)
        if start == -1:  # functions without the <tool_call> wrapper
            self._block(scan, 0, len(text), calls)
        while start != -1 and not full(calls):
            body = start + len(self.OPEN)
            end = scan.find(self.CLOSE, body)
            stop = len(text) if end == -1 else end
            if not self._block(scan, body, stop, calls):
                calls.append(broken(f"{self.OPEN} holds no {self.FUNCTION}NAME> element"))
            if end == -1:
                break
            start = scan.find(self.OPEN, end + len(self.CLOSE))
        return tuple(calls)

    def _block(self, scan: Scanner, start: int, stop: int, calls: list[ToolCall]) -> bool:
        """Append the calls of the functions in ``text[start:stop]``; whether there was one."""
        found = False
        at = scan.find(self.FUNCTION, start)
        while at != -1 and at < stop and not full(calls):
            found = True
            name_start = at + len(self.FUNCTION)
            name_end = scan.find(">", name_start)
            if name_end == -1 or name_end > stop:
                calls.append(broken(f"unterminated {self.FUNCTION}NAME> tag"))
                return True
            end = scan.find(self.FUNCTION_END, name_end)
            body_end = stop if end == -1 or end > stop else end
            calls.append(self._function(scan, scan.text[name_start:name_end].strip(), name_end + 1, body_end))
            at = scan.find(self.FUNCTION, body_end)
        return found

    def _function(self, scan: Scanner, name: str, start: int, stop: int) -> ToolCall:
        problem = valid_name(name, word=True)
        if problem is not None:
            return broken(f"the function name in {self.FUNCTION}NAME> {problem}")
        types = self._types.get(name, {})
        arguments: dict[str, Any] = {}
        text = scan.text
        at = scan.find(self.PARAMETER, start)
        while at != -1 and at < stop:
            key_start = at + len(self.PARAMETER)
            key_end = scan.find(">", key_start)
            if key_end == -1 or key_end > stop:
                return broken(f"tool call {name}: unterminated {self.PARAMETER}NAME> tag", name)
            key = text[key_start:key_end].strip()
            value_end, closer = scan.first((self.PARAMETER_END, self.PARAMETER), key_end + 1)
            if value_end == -1 or value_end > stop:
                value_end, closer = stop, ""
            value = text[key_end + 1 : value_end]
            if not closer:  # cut off: drop the start of a closing tag the generation stopped in
                value = _without_cut_tag(value, (self.PARAMETER_END, self.FUNCTION_END, self.CLOSE))
            if key in arguments:
                return broken(f"tool call {name}: parameter {json.dumps(key)[:80]} is given twice", name)
            arguments[key] = _convert(_strip_one_newline(value), types.get(key))
            at = scan.find(self.PARAMETER, value_end + (len(self.PARAMETER_END) if closer == self.PARAMETER_END else 0))
        return ToolCall(name=name, arguments=arguments)

    def write(self, call: ToolCall) -> str:
        """``call`` as the family's models write it (``parse`` reads it back): strings as they
        are, other values as JSON."""
        body = "".join(
            f"{self.PARAMETER}{key}>\n{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}\n{self.PARAMETER_END}\n"
            for key, value in call.arguments.items()
        )
        return f"{self.OPEN}\n{self.FUNCTION}{call.name}>\n{body}{self.FUNCTION_END}\n{self.CLOSE}"

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = tool_functions(tools)
        if not functions:
            return ""
        lines = ["You have access to the following functions:", "", "<tools>"]
        for function in functions:
            lines += ["<function>", f"<name>{function['name']}</name>"]
            if function.get("description"):
                lines.append(f"<description>{function['description']}</description>")
            lines.append("<parameters>")
            properties = parameters_of(function).get("properties") or {}
            for key, schema in properties.items():
                lines += ["<parameter>", f"<name>{key}</name>", f"<type>{schema.get('type', 'string')}</type>"]
                if schema.get("description"):
                    lines.append(f"<description>{schema['description']}</description>")
                if schema.get("enum"):
                    lines.append(f"<enum>{json.dumps(schema['enum'], ensure_ascii=False)}</enum>")
                lines.append("</parameter>")
            required = parameters_of(function).get("required") or []
            lines += [f"<required>{json.dumps(list(required))}</required>", "</parameters>", "</function>"]
        lines.append("</tools>")
        first = functions[0]
        example = [self.OPEN, f"{self.FUNCTION}{first['name']}>"]
        for key, value in example_arguments(first).items():
            shown = value if isinstance(value, str) else json.dumps(value)
            example += [f"{self.PARAMETER}{key}>", shown, self.PARAMETER_END]
        example += [self.FUNCTION_END, self.CLOSE]
        return (
            "\n".join(lines) + "\n\n"
            "To call a function, write exactly this format, one <parameter=...> element per argument:\n"
            + "\n".join(example)
            + "\n"
            f"You may call several functions in one message, one {self.OPEN} block each. Each result "
            f"comes back to you in a tool message. {DONE}"
        )


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _without_cut_tag(value: str, closers: tuple[str, ...]) -> str:
    """``value`` without a trailing beginning of one of ``closers`` (``...\\n</param``)."""
    cut = value.rfind("<", max(0, len(value) - max(map(len, closers))))
    if cut != -1 and any(c.startswith(value[cut:]) for c in closers):
        return value[:cut]
    return value


def _convert(value: str, declared: Any) -> Any:
    """A parameter value by its declared JSON-schema type, or by its text when none is known."""
    if declared == "string" or (isinstance(declared, list) and "string" in declared):
        return value
    if declared in ("boolean",):
        lowered = value.strip().lower()
        return {"true": True, "false": False}.get(lowered, value)
    if not value.strip() or value.lstrip()[0] not in _JSON_START:
        return value
    try:
        decoded = loads(value)
    except BadJSON:
        return value
    return value if isinstance(decoded, str) else decoded
