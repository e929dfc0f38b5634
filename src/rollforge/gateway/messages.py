"""The Anthropic Messages wire format (``POST /v1/messages``), no I/O: a translation onto chat completions.

A Messages request is translated into the chat-completions body it means (``chat_body``), which
``wire.parse_request`` validates and the session records exactly as it records chat completions:
one recorder, one token ledger. The translation:

- ``system`` (a string or text blocks) is the first, ``system`` message;
- a ``user`` message's ``tool_result`` blocks are ``tool`` messages (``tool_call_id`` the
  ``tool_use_id``), in order, then its text and ``image`` blocks are one ``user`` message;
- an ``image`` block (in a user message or a tool result) with a ``base64`` source is the chat
  ``image_url`` part of its ``data:`` URL, checked as chat's are (``images.py``: the bytes must be a
  PNG, JPEG, GIF or WebP image); a ``url`` source is refused naming the URL: the gateway fetches
  nothing;
- an ``assistant`` message's text blocks are its content and its ``tool_use`` blocks its tool
  calls (``input`` as the arguments), so a reply the client sends back is recognised as the one
  the gateway sent and the conversation continues in the same segment;
- ``tools`` (``name``, ``description``, ``input_schema``) are function tools; ``tool_choice``
  ``auto`` / ``any`` / ``none`` / ``{"type": "tool", "name": ...}`` are ``auto`` / ``required`` /
  ``none`` / that named function (``any`` and a named tool are honoured by a forced opener:
  ``forcing.py``);
- ``max_tokens``, ``stop_sequences``, ``temperature``, ``top_p`` and ``stream`` keep their meaning.

What the gateway cannot honour is refused with a 400 naming the field (image URLs, documents,
``thinking``, ``top_k``, ``disable_parallel_tool_use``), never
dropped. Replies: ``message_body``
for a whole message, ``message_events`` for the same reply as the Messages SSE events
(``message_start``, each content block's ``content_block_start`` / ``_delta`` / ``_stop``,
``message_delta`` with the stop reason, ``message_stop``). Errors are in Anthropic's shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Iterator

from ..errors import WireError
from .images import image_url_part
from .wire import Choice

#: Chat-completions finish reasons as Messages stop reasons.
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
#: Request fields the gateway cannot honour, with the reason given when one is set.
_REFUSED = {
    "thinking": "extended thinking is not supported by the gateway",
    "top_k": "the gateway samples with the session's top_k",
}


def chat_body(body: Any) -> dict[str, Any]:
    """The chat-completions body a Messages request means (see the module docstring)."""
    if not isinstance(body, Mapping):
        raise WireError(f"the request body must be a JSON object, got {type(body).__name__}")
    for key, reason in _REFUSED.items():
        if body.get(key) is not None and not (key == "thinking" and _disabled(body[key])):
            raise WireError(f"'{key}' {body[key]!r} is not honoured: {reason}", key)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise WireError(f"'max_tokens' must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError('\'messages\' must be a non-empty list of {"role", "content"} objects', "messages")
    chat: list[dict[str, Any]] = []
    if body.get("system"):
        chat.append({"role": "system", "content": _text_parts(body["system"], "system")})
    for i, message in enumerate(messages):
        chat += _chat_messages(message, f"messages[{i}]")
    out = {key: body[key] for key in ("model", "temperature", "top_p", "stream") if key in body}
    out.update(messages=chat, max_tokens=max_tokens, tools=_tools(body.get("tools")))
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
            raise WireError(f"'stop_sequences' must be a list of at most 4 strings, got {stop!r}", "stop_sequences")
        out["stop"] = stop
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    return out


def _disabled(thinking: Any) -> bool:
    return isinstance(thinking, Mapping) and thinking.get("type") == "disabled"


def _chat_messages(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, Mapping) or raw.get("role") not in ("user", "assistant"):
        role = raw.get("role") if isinstance(raw, Mapping) else type(raw).__name__
        raise WireError(f"{where}.role {role!r} is not 'user' or 'assistant'", f"{where}.role")
    content = raw.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise WireError(
            f"{where}.content must be a string or a list of content blocks, got {type(content).__name__}",
            f"{where}.content",
        )
    texts, calls, results = [], [], []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
        allowed = ("text", "tool_use") if raw["role"] == "assistant" else ("text", "image", "tool_result")
        if kind not in allowed:
            raise WireError(
                f"{where}.content[{k}] is of type {kind!r}; a {raw['role']} message takes "
                f"{' and '.join(allowed)} blocks here",
                f"{where}.content",
            )
        if kind == "text":
            texts.append(_text_block(block, f"{where}.content[{k}]"))
        elif kind == "image":
            texts.append(_image_block(block, f"{where}.content[{k}]"))
        elif kind == "tool_use":
            calls.append(_call(block, f"{where}.content[{k}]"))
        else:
            results.append(_result(block, f"{where}.content[{k}]"))
    if raw["role"] == "assistant":
        return [{"role": "assistant", "content": texts, **({"tool_calls": calls} if calls else {})}]
    return [*results, *([{"role": "user", "content": texts}] if texts or not results else [])]


def _text_block(block: Mapping[str, Any], where: str) -> dict[str, str]:
    if not isinstance(block.get("text"), str):
        raise WireError(f'{where} must be {{"type": "text", "text": <string>}}', where)
    return {"type": "text", "text": block["text"]}


def _image_block(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An ``image`` block as the chat ``image_url`` part of its base64 source's ``data:`` URL."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "url":
        return image_url_part(source.get("url"), f"{where}.source.url")  # refused, naming the URL
    if kind != "base64" or not isinstance(source.get("media_type"), str) or not isinstance(source.get("data"), str):
        raise WireError(
            f'{where} must be {{"type": "image", "source": {{"type": "base64", "media_type", "data"}}}}',
            f"{where}.source",
        )
    return image_url_part(f"data:{source['media_type']};base64,{source['data']}", f"{where}.source")


def _content_parts(value: Any, where: str) -> list[dict[str, Any]]:
    """A tool result's content (a string, or text and image blocks) as chat content parts."""
    if not isinstance(value, list):
        return _text_parts(value, where)
    parts = []
    for k, block in enumerate(value):
        kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
        if kind not in ("text", "image"):
            raise WireError(f"{where} holds a block of type {kind!r}; a tool result takes text and image blocks", where)
        parts.append((_text_block if kind == "text" else _image_block)(block, f"{where}[{k}]"))
    return parts


def _text_parts(value: Any, where: str) -> list[dict[str, str]]:
    """A string or a list of text blocks as chat text parts (``cache_control`` has no meaning here)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, list) and all(isinstance(b, Mapping) and b.get("type") == "text" for b in value):
        return [_text_block(b, f"{where}[{k}]") for k, b in enumerate(value)]
    if isinstance(value, list):
        kind = next(
            b.get("type") if isinstance(b, Mapping) else type(b).__name__
            for b in value
            if not (isinstance(b, Mapping) and b.get("type") == "text")
        )
        raise WireError(f"{where} holds a block of type {kind!r}; the gateway takes text blocks only", where)
    raise WireError(f"{where} must be a string or a list of text blocks, got {type(value).__name__}", where)


def _call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if (
        not isinstance(block.get("id"), str)
        or not isinstance(block.get("name"), str)
        or not isinstance(block.get("input"), Mapping)
    ):
        raise WireError(f'{where} must be {{"type": "tool_use", "id", "name", "input": {{...}}}}', where)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": json.dumps(block["input"])},
    }


def _result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise WireError(f"{where} needs the string 'tool_use_id' of the tool_use it answers", f"{where}.tool_use_id")
    content = block.get("content")
    return {
        "role": "tool",
        "tool_call_id": block["tool_use_id"],
        "content": _content_parts(content, f"{where}.content") if content else "",
    }


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise WireError(
            f'\'tools\' must be a list of {{"name", "input_schema"}} objects, got {type(tools).__name__}', "tools"
        )
    out = []
    for k, tool in enumerate(tools):
        if (
            not isinstance(tool, Mapping)
            or not isinstance(tool.get("name"), str)
            or not isinstance(tool.get("input_schema"), Mapping)
        ):
            raise WireError(
                f'tools[{k}] must be a custom tool {{"name", "description", "input_schema"}}; '
                f"the gateway runs no server tools",
                f"tools[{k}]",
            )
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind not in ("auto", "any", "none", "tool") or (kind == "tool" and not isinstance(choice.get("name"), str)):
        raise WireError(
            f'\'tool_choice\' {choice!r} is not {{"type": "auto" | "any" | "none"}} or {{"type": "tool", "name": ...}}',
            "tool_choice",
        )
    if choice.get("disable_parallel_tool_use"):
        raise WireError(
            "'tool_choice.disable_parallel_tool_use' true is not honoured: the gateway returns "
            "every call the model makes",
            "tool_choice.disable_parallel_tool_use",
        )
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]


# -- replies -------------------------------------------------------------------------------------


def message_body(message_id: str, model: str, choice: Choice, prompt_tokens: int) -> dict[str, Any]:
    """The reply as one Messages ``message`` object."""
    return {
        **_message_head(message_id, model),
        "content": _blocks(choice),
        "stop_reason": _STOP_REASONS[choice.finish_reason],
        "usage": {"input_tokens": prompt_tokens, "output_tokens": choice.completion_tokens},
    }


def message_events(
    message_id: str, model: str, choice: Choice, prompt_tokens: int
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The same reply as ``(event, data)`` pairs of the Messages SSE stream."""
    head = {
        **_message_head(message_id, model),
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }
    yield "message_start", {"type": "message_start", "message": head}
    for index, block in enumerate(_blocks(choice)):
        if block["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
        yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP_REASONS[choice.finish_reason], "stop_sequence": None},
            "usage": {"output_tokens": choice.completion_tokens},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def error_body(exc: WireError) -> dict[str, Any]:
    """The error in Anthropic's shape (the SDK raises ``BadRequestError`` etc. with the message)."""
    kind = {404: "not_found_error"}.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": str(exc)}}


def _message_head(message_id: str, model: str) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "stop_sequence": None}


def _blocks(choice: Choice) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": choice.content}] if choice.content else []
    for call in choice.tool_calls:
        # the session's arguments are canonical JSON of an object (calls that do not parse are not calls)
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)})
    return blocks
