"""Mistral ``[TOOL_CALLS]``: the text form of what ``mistral-common`` encodes.

``mistral-common`` (1.13) encodes tool calls; it decodes them only from token ids, in private
experimental functions (``mistral_common.experimental.tools._decode_tool_calls``) that raise on
malformed output and need the model's Mistral tokenizer. ``parse`` gets text and must never raise,
so it applies the same rules to the text; the tests check it against what mistral-common's v3 and
v11 instruct tokenizers encode. Two forms, both read:

- tokenizer v2-v7 (Mistral 7B v0.3, Nemo, Large 2): ``[TOOL_CALLS] [{"name": ..., "arguments":
  {...}, "id": "a1b2c3d4e"}, ...]`` -- one JSON list (a single object is accepted too);
- tokenizer v11+ (Mistral Small 3.x, Magistral, Devstral): ``[TOOL_CALLS]NAME[ARGS]{...}`` once
  per call, with ``[CALL_ID]ID`` between name and ``[ARGS]`` where the tokenizer writes ids.

Ids: Mistral's templates and validator require a tool-call id of exactly 9 ASCII letters and
digits. An id the model wrote is kept when it has that shape; a call with a malformed id is an
error call (reported to the model), because rendering it back would make the template raise.
When the format carries no id (v11 without ``[CALL_ID]``), ``id`` is None and whoever renders
the tool messages supplies one. Text before the first ``[TOOL_CALLS]`` is the message's content.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from ...types import ToolCall
from .decoding import (
    MAX_CALLS,
    BadJSON,
    arguments_object,
    broken,
    call_from_object,
    decode_prefix,
    full,
    salvage_name,
    valid_name,
)
from ._prompt import DONE, dumps, example_arguments, tool_functions

_ID = re.compile(r"[A-Za-z0-9]{9}")


class MistralParser:
    """``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}]`` or ``[TOOL_CALLS]NAME[ARGS]{...}``."""

    TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
    #: Text whose presence means the reply tried to call a tool.
    markers: tuple[str, ...] = (TOOL_CALLS,)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        if self.TOOL_CALLS not in text:
            return ()
        calls: list[ToolCall] = []
        for chunk in text.split(self.TOOL_CALLS)[1:]:
            body = chunk.lstrip()
            for call in self._json_form(body) if body.startswith(("[", "{")) else [self._named_form(chunk)]:
                if full(calls):
                    return tuple(calls)
                calls.append(call)
        return tuple(calls)

    def _json_form(self, body: str) -> list[ToolCall]:
        try:
            data, _ = decode_prefix(body)
        except BadJSON as exc:
            return [broken(f"invalid JSON after {self.TOOL_CALLS}: {exc}", salvage_name(body))]
        items = data if isinstance(data, list) else [data]
        if not items:
            return [broken(f"{self.TOOL_CALLS} is followed by an empty list")]
        return [self._checked_id(call_from_object(item)) for item in items[: MAX_CALLS + 1]]

    def _named_form(self, chunk: str) -> ToolCall:
        args_at = chunk.find(self.ARGS)
        head = chunk if args_at == -1 else chunk[:args_at]
        name, _, call_id = head.partition(self.CALL_ID)
        name = name.strip()
        problem = valid_name(name, word=True)
        if problem is not None:
            return broken(f"the tool name after {self.TOOL_CALLS} {problem}")
        if args_at == -1:
            return broken(f"tool call {name}: expected {self.ARGS} and a JSON object after the name", name)
        try:
            data, _ = decode_prefix(chunk, args_at + len(self.ARGS))
        except BadJSON as exc:
            return broken(f"invalid JSON in the arguments of tool call {name}: {exc}", name)
        arguments = arguments_object(data, self.ARGS, name)
        if isinstance(arguments, ToolCall):
            return arguments
        call = ToolCall(name=name, arguments=arguments, id=call_id.strip() if self.CALL_ID in head else None)
        return self._checked_id(call)

    def _checked_id(self, call: ToolCall) -> ToolCall:
        if call.error is None and call.id is not None and not _ID.fullmatch(call.id):
            shown = json.dumps(call.id[:40])  # ASCII: the id is model output
            return broken(f"tool call {call.name}: id {shown} must be 9 letters and digits", call.name)
        return call

    def write(self, call: ToolCall) -> str:
        """``call`` in the v0.3/Nemo form (``parse`` reads it back); the id only when it has one."""
        body = {"name": call.name, "arguments": dict(call.arguments), **({"id": call.id} if call.id else {})}
        return f"{self.TOOL_CALLS} {dumps([body])}"

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = tool_functions(tools)
        if not functions:
            return ""
        first = functions[0]
        listed = dumps([{"type": "function", "function": dict(f)} for f in functions])
        example = dumps([{"name": first["name"], "arguments": example_arguments(first), "id": "a1b2c3d4e"}])
        return (
            f"You can call the following tools:\n{listed}\n\n"
            f"To call tools, write {self.TOOL_CALLS} followed by a JSON list of calls, each with its "
            '"name", its "arguments" and an "id" of 9 letters and digits, exactly like this:\n'
            f"{self.TOOL_CALLS} {example}\n"
            f"Each result comes back to you in a tool message with the call's id. {DONE}"
        )
