"""NeMo Gym's wire shapes (the OpenAI Responses API) to and from rollforge's messages; no I/O.

A NeMo Gym dataset row holds ``responses_create_params`` (``input``: text or a list of
``{"role", "content"}`` items, roles ``system``/``developer``/``user``/``assistant``; optional
``instructions``; ``tools`` in the Responses function format ``{"type": "function", "name",
"description", "parameters", "strict"}``) next to the verifier's own columns. ``prompt_of`` and
``tools_of`` read them; ``response_of`` writes what the policy generated back as a Responses
``response`` (``output`` items ``message``, ``function_call``, ``function_call_output``), which the
server's ``/verify`` and ``/step`` read.

An assistant message with tool calls becomes its ``function_call`` items only: its text holds the
model family's tool-call markup, which a verifier would otherwise read as the answer. Calls the
parser gave no id get a stable one from their position (``call_id``), so the ids sent to a tool
route, recorded on tool messages and sent to ``/verify`` agree.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ...errors import ConfigError
from ...types import Message, ToolCall

#: The row column holding the Responses request of a NeMo Gym dataset row.
PARAMS = "responses_create_params"

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def params_of(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """The row's ``responses_create_params``, or a ``ConfigError`` naming what the row has."""
    params = row.get(PARAMS)
    if not isinstance(params, Mapping):
        raise ConfigError(
            f"a NeMo Gym row needs a {PARAMS!r} object (the dataset's JSONL shape), got columns {sorted(row)}"
        )
    return params


def _text(content: Any, where: str) -> str:
    """A Responses ``content``: a string, or a list of ``input_text``/``output_text`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ConfigError(f"{where}: content must be text or a list of text parts, got {content!r:.80}")


def prompt_of(row: Mapping[str, Any]) -> tuple[Message, ...]:
    """The opening conversation of a NeMo Gym row: ``instructions`` as a system message, then
    ``input`` (text as one user message; ``developer`` items become system messages)."""
    params = params_of(row)
    head = (Message("system", _text(params["instructions"], "instructions")),) if params.get("instructions") else ()
    items = params.get("input")
    if isinstance(items, str):
        return (*head, Message("user", items))
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{PARAMS}.input must be text or a non-empty list of messages, got {items!r:.80}")
    messages = []
    for n, item in enumerate(items):
        where = f"{PARAMS}.input[{n}]"
        role = item.get("role") if isinstance(item, Mapping) else None
        if role not in _ROLES or item.get("type", "message") != "message":
            raise ConfigError(f"{where} must be a message with a role in {sorted(_ROLES)}, got {item!r:.80}")
        messages.append(Message(_ROLES[role], _text(item.get("content", ""), where)))
    return (*head, *messages)


def tools_of(row: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """The row's Responses function tools in the chat format ``Reset.tools`` holds."""
    tools = params_of(row).get("tools") or []
    out = []
    for n, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise ConfigError(f"{PARAMS}.tools[{n}] must be a function tool with a name, got {tool!r:.80}")
        function = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        out.append({"type": "function", "function": function})
    return tuple(out)


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def argument_problem(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """What is wrong with ``arguments`` for a tool's ``parameters`` schema, one level deep (missing
    required, unexpected when ``additionalProperties`` is false, a wrong JSON type), else None."""
    properties = parameters.get("properties") or {}
    missing = [name for name in parameters.get("required") or () if name not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(missing)}"
    unexpected = [name for name in arguments if name not in properties]
    if unexpected and parameters.get("additionalProperties") is False:
        return f"unexpected argument(s) {', '.join(unexpected)}; expected: {', '.join(properties) or 'none'}"
    for name, value in arguments.items():
        expected = (properties.get(name) or {}).get("type")
        types = _JSON_TYPES.get(expected) if isinstance(expected, str) else None
        if types and (not isinstance(value, types) or (isinstance(value, bool) and expected != "boolean")):
            return f"argument {name!r} must be of type {expected}, got {json.dumps(value)[:40]}"
    return None


def call_id(position: int, index: int, call: ToolCall) -> str:
    """The id of the ``index``-th call of the assistant message at ``position`` in the conversation."""
    return call.id or f"call_{position}_{index}"


def output_items(messages: Sequence[Message], start: int) -> list[dict[str, Any]]:
    """``messages[start:]`` as Responses output items (see the module docstring)."""
    items: list[dict[str, Any]] = []
    for position in range(start, len(messages)):
        message = messages[position]
        if message.role == "assistant" and message.tool_calls:
            items += [
                {
                    "type": "function_call",
                    "id": f"fc_{position}_{i}",
                    "call_id": call_id(position, i, call),
                    "name": call.name,
                    "arguments": json.dumps(dict(call.arguments)),
                    "status": "completed",
                }
                for i, call in enumerate(message.tool_calls)
                if call.error is None
            ]
        elif message.role == "assistant":
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{position}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": message.content, "annotations": []}],
                }
            )
        elif message.role == "tool":
            items.append(
                {"type": "function_call_output", "call_id": message.tool_call_id or "", "output": message.content}
            )
        else:
            items.append({"type": "message", "role": message.role, "content": message.content})
    return items


def response_of(row: Mapping[str, Any], messages: Sequence[Message], start: int) -> dict[str, Any]:
    """A Responses ``response`` whose output is ``messages[start:]``."""
    params = params_of(row)
    return {
        "id": f"resp_rollforge_{len(messages)}",
        "object": "response",
        "created_at": 0,
        "model": str(params.get("model") or "rollforge"),
        "status": "completed",
        "output": output_items(messages, start),
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": list(params.get("tools") or []),
    }
