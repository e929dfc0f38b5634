"""Llama 3.x JSON tool calls: the whole message is one JSON object ``{"name": ..., "parameters": {...}}``.

``arguments`` is accepted in place of ``parameters``, and a leading ``<|python_tag|>`` is skipped.
A JSON object with neither a name nor parameters is an answer, not a call; so is a JSON object
followed by prose.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...types import ToolCall
from .decoding import BadJSON, broken, call_from_object, decode_prefix, only_trailing_special, salvage_name
from ._prompt import DONE, dumps, example_arguments, tool_functions, tool_list


class Llama3JsonParser:
    """The whole message is one JSON object ``{"name": ..., "parameters": {...}}`` (Llama 3.x)."""

    PYTHON_TAG = "<|python_tag|>"
    ARGUMENT_KEYS = ("parameters", "arguments")
    #: Text whose presence means the reply may be a tool call (``parse`` decides).
    markers: tuple[str, ...] = (PYTHON_TAG, '{"name"')

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        body = text.strip()
        if body.startswith(self.PYTHON_TAG):
            body = body[len(self.PYTHON_TAG) :].lstrip()
        if not body.startswith("{"):
            return ()
        try:
            data, end = decode_prefix(body)
        except BadJSON as exc:
            return (broken(f"invalid JSON in tool call: {exc}", salvage_name(body)),)
        if not only_trailing_special(body, end):
            return ()  # JSON followed by prose: an answer that happens to start with an object
        if "name" not in data and not any(k in data for k in self.ARGUMENT_KEYS):
            return ()
        return (call_from_object(data, self.ARGUMENT_KEYS),)

    def write(self, call: ToolCall) -> str:
        """``call`` as the family's models write it (``parse`` reads it back)."""
        return dumps({"name": call.name, "parameters": dict(call.arguments)})

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = tool_functions(tools)
        if not functions:
            return ""
        first = functions[0]
        example = dumps({"name": first["name"], "parameters": example_arguments(first)})
        return (
            "You can call the following tools:\n"
            f"{tool_list(functions)}\n\n"
            'To call a tool, reply with only a JSON object with its "name" and its "parameters", '
            "and nothing else, exactly like this:\n"
            f"{example}\n"
            f"Call one tool per message. Each result comes back to you in a tool message. {DONE}"
        )
