"""Hermes / Qwen 2.5 / Qwen 3: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Any number of calls per message. Blocks are found with ``str.find`` (linear in the reply, whatever
the model wrote). An unterminated final ``<tool_call>`` (generation stopped before the closing
tag, or inside it: ``</tool_call``) counts when one JSON object follows it; when none does, it is
reported as an error call rather than ignored, because the model did try to call a tool. A call
whose JSON is broken keeps its tool name when a ``"name": "..."`` pair is readable.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...types import ToolCall
from .decoding import BadJSON, broken, call_from_object, decode_prefix, full, loads, only_trailing_special, salvage_name
from ._prompt import DONE, dumps, example_arguments, tool_functions, tool_list


class HermesParser:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes, Qwen 2.5/3)."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    #: Text whose presence means the reply tried to call a tool.
    markers: tuple[str, ...] = (OPEN,)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        calls: list[ToolCall] = []
        start = text.find(self.OPEN)
        while start != -1 and not full(calls):
            body = start + len(self.OPEN)
            end = text.find(self.CLOSE, body)
            if end == -1:  # no closing tag anywhere after: this is the last call
                calls.append(self._decode_unterminated(text, body))
                break
            calls.append(self._decode(text[body:end]))
            start = text.find(self.OPEN, end + len(self.CLOSE))
        return tuple(calls)

    def _decode(self, payload: str) -> ToolCall:
        try:
            data = loads(payload)
        except BadJSON as exc:
            return broken(f"invalid JSON in {self.OPEN}: {exc}", salvage_name(payload))
        return call_from_object(data)

    def _decode_unterminated(self, text: str, body: int) -> ToolCall:
        try:
            data, end = decode_prefix(text, body)
        except BadJSON as exc:
            return broken(f"invalid JSON in unterminated {self.OPEN}: {exc}", salvage_name(text[body:]))
        if not only_trailing_special(text, end, self.CLOSE):
            name = data.get("name") if isinstance(data, dict) and isinstance(data.get("name"), str) else ""
            return broken(f"unterminated {self.OPEN}: text follows the JSON object; close it with {self.CLOSE}", name)
        return call_from_object(data)

    def write(self, call: ToolCall) -> str:
        """``call`` as the family's models write it (``parse`` reads it back)."""
        body = dumps({"name": call.name, "arguments": dict(call.arguments)})
        return f"{self.OPEN}\n{body}\n{self.CLOSE}"

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = tool_functions(tools)
        if not functions:
            return ""
        first = functions[0]
        example = dumps({"name": first["name"], "arguments": example_arguments(first)})
        return (
            "You can call the following tools:\n"
            f"{tool_list(functions)}\n\n"
            f'To call a tool, write a JSON object with its "name" and its "arguments" between '
            f"{self.OPEN} and {self.CLOSE} tags, exactly like this:\n"
            f"{self.OPEN}\n{example}\n{self.CLOSE}\n"
            "You may call several tools in one message, one tag pair per call. Each result comes back "
            f"to you in a tool message. {DONE}"
        )
