"""The OpenAI Responses wire format (``POST /v1/responses``), no I/O: translated onto chat completions.

A Responses request is rewritten into the chat-completions body the session already records
(``chat_body``), so recording is the chat path's, token for token: ``instructions`` become the
system message, ``input`` (a string, or items) the messages -- an assistant ``message`` item and the
``function_call`` items after it are one assistant message with tool calls, a
``function_call_output`` is a tool message; ``input_image`` parts (``image_url`` a ``data:`` URL,
``images.py``) are the chat form's ``image_url`` parts -- and the flat function tools the chat form's
``{"type": "function", "function": {...}}``; ``tool_choice`` ``required`` and
``{"type": "function", "name": ...}`` are honoured as on chat completions (a forced opener,
``forcing.py``). ``max_output_tokens`` is ``max_completion_tokens``.

``previous_response_id`` is served from the responses this session answered (``ResponseStore``):
the conversation that response ended (its input and its output, without its instructions)
precedes the new input. An id this session did not answer is a 400 naming it.

Refused with a 400 naming the field: item and tool types other than the above, ``conversation``,
``prompt``, ``background``, and a ``text.format`` other than plain text (structured output is not
enforced). ``reasoning``, ``include``, ``store``, ``truncation``, ``parallel_tool_calls`` and
``text.verbosity`` are accepted and change nothing.

The reply: ``response_body`` gives the ``response`` object (output items: a ``message`` with one
``output_text`` part when there is visible text, then one ``function_call`` per call; status
``incomplete`` when the token budget ran out), ``stream_events`` the same as the Responses
server-sent-event sequence, ``response.created`` ... ``response.completed``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import WireError
from .images import image_url_part
from .wire import Choice, integer_field

_PASSED = ("model", "temperature", "top_p", "stream")
_REFUSED = ("conversation", "prompt", "background")


class ResponseStore:
    """The conversations (chat messages, input and output) of the responses one session answered."""

    def __init__(self) -> None:
        self._conversations: dict[str, list[dict[str, Any]]] = {}

    def history(self, response_id: Any) -> list[dict[str, Any]]:
        if response_id is None:
            return []
        if response_id not in self._conversations:
            raise WireError(
                f"'previous_response_id' {response_id!r} is not a response of this session "
                "(the gateway keeps only the responses of the session it serves)",
                "previous_response_id",
                code="previous_response_not_found",
            )
        return list(self._conversations[response_id])

    def keep(self, response_id: str, body: Mapping[str, Any], chat: Mapping[str, Any], choice: Choice) -> None:
        """Keep what response ``response_id`` ended: its chat messages without the instructions, then the reply."""
        messages = chat["messages"][1:] if body.get("instructions") else chat["messages"]
        self._conversations[response_id] = [*messages, reply_message(choice)]


# -- requests ----------------------------------------------------------------------------------


def chat_body(body: Any, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body of a Responses request; ``history``: the previous response's
    conversation (``ResponseStore.history``). Its ``messages`` start with the instructions."""
    if not isinstance(body, Mapping):
        raise WireError(f"the request body must be a JSON object, got {type(body).__name__}")
    for key in _REFUSED:
        if body.get(key):
            raise WireError(f"'{key}' is not supported by the rollforge gateway; send the conversation as 'input'", key)
    _check_text(body.get("text"))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise WireError(f"'instructions' must be a string, got {instructions!r}", "instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    chat: dict[str, Any] = {key: body[key] for key in _PASSED if key in body}
    chat["messages"] = system + history + input_messages(body.get("input"))
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = integer_field(body, "max_output_tokens", None, 1)
    return chat


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise WireError("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, Mapping) else None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise WireError(
                    f"{where}.role {role!r} is not one of user, system, developer, assistant", f"{where}.role"
                )
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)},
            }
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":  # calls without text: an assistant message of their own
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _text(item.get("output"), where, "output"),
                }
            )
        else:
            shown = kind if kind is not None else type(item).__name__
            raise WireError(
                f"{where} is of type {shown!r}; the gateway takes message, function_call and "
                "function_call_output items",
                f"{where}.type",
            )
    return messages


def _text(value: Any, where: str, field: str = "content") -> str | list[dict[str, Any]]:
    """Text parts joined into a string; with ``input_image`` parts, the chat parts (text and
    ``image_url``, in order) for ``wire.parse_request`` to read."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts: list[dict[str, Any]] = []
        for k, part in enumerate(value):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            if kind == "input_image":
                parts.append(_image_part(part, f"{where}.{field}[{k}]"))
            elif kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
                raise WireError(
                    f"{where}.{field}[{k}] is of type {kind!r}; the gateway takes input_text, "
                    "output_text and input_image parts only",
                    f"{where}.{field}",
                )
            else:
                parts.append({"type": "text", "text": part["text"]})
        if any(p["type"] == "image_url" for p in parts):
            return parts
        return "".join(p["text"] for p in parts)
    raise WireError(
        f"{where}.{field} must be a string or a list of text parts, got {type(value).__name__}", f"{where}.{field}"
    )


def _image_part(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    if part.get("file_id") is not None and part.get("image_url") is None:
        raise WireError(
            f"{where}.file_id {part['file_id']!r} is not served: the gateway keeps no files; send the image "
            "as 'image_url', a data: URL",
            f"{where}.file_id",
        )
    return image_url_part(part.get("image_url"), f"{where}.image_url")


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise WireError(f"{where}.{key} must be a string, got {value!r}", f"{where}.{key}")
    return value


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise WireError("'tools' must be a list of function tools", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise WireError(
                f"tools[{i}] of type {kind!r} is not supported: the gateway takes "
                '{"type": "function", "name": ...} tools only',
                f"tools[{i}]",
            )
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if isinstance(value, Mapping) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    if isinstance(value, str):
        return value  # auto, none, required: the chat form checks them
    raise WireError(
        f"'tool_choice' {value!r} is not 'auto', 'none', 'required' or {{\"type\": \"function\", \"name\": ...}}",
        "tool_choice",
    )


def _check_text(text: Any) -> None:
    if text is None:
        return
    form = text.get("format") if isinstance(text, Mapping) else text
    if form is not None and (not isinstance(form, Mapping) or form.get("type") != "text"):
        raise WireError(
            f"'text.format' {form!r} is not supported: the gateway does not constrain the reply to a "
            'format; leave it out or send {"type": "text"}',
            "text.format",
        )


# -- responses ---------------------------------------------------------------------------------


def output_items(choice: Choice) -> list[dict[str, Any]]:
    """The reply as output items: its visible text as a ``message``, then its calls."""
    items: list[dict[str, Any]] = []
    if choice.content or not choice.tool_calls:
        text = {"type": "output_text", "text": choice.content or "", "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in choice.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def response_body(
    response_id: str,
    model: str,
    created: int,
    body: Mapping[str, Any],
    choice: Choice,
    items: list[dict[str, Any]],
    prompt_tokens: int,
) -> dict[str, Any]:
    """The ``response`` object; ``body``: the request (its settings are echoed)."""
    incomplete = choice.finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "instructions": body.get("instructions"),
        "output": items,
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "text": {"format": {"type": "text"}},
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": choice.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + choice.completion_tokens,
        },
    }


def reply_message(choice: Choice) -> dict[str, Any]:
    """The reply as the chat message a client sends back (kept for ``previous_response_id``)."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.content or ""}
    if choice.tool_calls:
        message["tool_calls"] = [call.to_json() for call in choice.tool_calls]
    return message


def stream_events(response: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The server-sent events of a finished ``response``, in order: created, in progress, each
    output item (added, its text or arguments as one delta, done), then completed (or incomplete)."""
    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response["output"]):
        events += _item_events(index, item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": response})
    for number, event in enumerate(events):
        yield {**event, "sequence_number": number}


def _item_events(index: int, item: Mapping[str, Any]) -> list[dict[str, Any]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        return [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
            {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
            {
                "type": "response.function_call_arguments.done",
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            },
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    part = item["content"][0]
    text, part_at = part["text"], {**at, "content_index": 0}
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "content": [], "status": "in_progress"},
        },
        {"type": "response.content_part.added", **part_at, "part": {**part, "text": ""}},
        {"type": "response.output_text.delta", **part_at, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", **part_at, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **part_at, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
