"""The OpenAI chat-completions wire format, no I/O: request bodies in, response bodies out.

``parse_request`` validates a ``/v1/chat/completions`` body field by field into a ``ChatRequest``
(a bad field is a ``WireError`` naming it, answered as HTTP 400 in OpenAI's error shape).
Messages are normalised into hashable ``WireMessage`` values so that a session can tell whether a
request extends its previous conversation: text parts are joined and image parts decoded into the
message's images (``images.py``: ``data:`` URLs only, on user and tool messages), ``developer`` is ``system``,
tool-call arguments are compared as canonical JSON, and fields the SDKs echo back with no meaning
for the conversation (``refusal``, ``audio``, ``annotations``, ``null`` values) are ignored.

``tool_choice``: ``none`` leaves replies unparsed (text only); ``required`` and a named function
(``{"type": "function", "function": {"name": ...}}``, which must be one of ``tools``) are honoured
by forcing the family's tool-call opener before the generation (``forcing.py``: the forced tokens
are recorded under mask 0, out of the loss); ``allowed_tools`` and ``custom`` choices are refused
(HTTP 400 naming the field), as is a ``response_format`` other than ``text``: the gateway does not
constrain decoding to a JSON schema. Tools always reach the prompt, so that a session's rendering
does not change with the choice.

Responses: ``completion_body`` for a whole response, ``stream_chunks`` for the same reply as
server-sent-event chunks (a role chunk, the content, each tool call whole, a finish chunk).
Generation is not token-streamed (backends return whole completions); a streaming client gets the
reply as soon as it is complete.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from collections.abc import Mapping  # isinstance on typing.Mapping costs ~10x more per message
from typing import Any, Iterator, Sequence

from ..errors import WireError
from .images import message_content

#: The most choices one request may ask for (``n``).
MAX_CHOICES = 16


@dataclass(frozen=True)
class WireCall:
    """A tool call as the client sees it; ``arguments`` is canonical JSON text."""

    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class WireMessage:
    """One chat message as the client sent it, normalised for comparison."""

    role: str
    content: str
    tool_calls: tuple[WireCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    #: The encoded bytes of the message's ``image_url`` parts, in order (``images.message_content``).
    images: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat-completions request. ``tools`` are OpenAI function schemas."""

    model: str | None
    messages: tuple[WireMessage, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    """``auto``, ``none``, ``required`` or ``function`` (a named one: ``tool_name``)."""
    tool_name: str | None = None
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    logprobs: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    #: The tools as canonical JSON: a change of tools is a rewritten history.
    tools_key: str = ""


@dataclass(frozen=True)
class Choice:
    """One generated reply as sent back: visible ``content``, parsed ``tool_calls``, the reason it
    ended (``stop``, ``length``, ``tool_calls``) and, when asked, ``(token text, logprob)`` pairs."""

    content: str | None
    tool_calls: tuple[WireCall, ...]
    finish_reason: str
    logprobs: tuple[tuple[str, float], ...] | None = None
    completion_tokens: int = 0

    @property
    def message(self) -> WireMessage:
        """The assistant message a client sends back when it continues the conversation."""
        return WireMessage("assistant", self.content or "", self.tool_calls)


# -- requests ----------------------------------------------------------------------------------


def parse_request(body: Any, known: tuple[Sequence[Any], Sequence[WireMessage]] = ((), ())) -> ChatRequest:
    """``known``: the raw and parsed messages of the session's previous request; the messages
    equal to them (most of the conversation) are not parsed again."""
    if not isinstance(body, Mapping):
        raise WireError(f"the request body must be a JSON object, got {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError("'messages' must be a non-empty list of chat messages", "messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools):
        raise WireError('\'tools\' must be a list of {"type": "function", "function": {"name": ...}} objects', "tools")
    n = integer_field(body, "n", 1, 1, MAX_CHOICES)
    if body.get("top_logprobs"):
        raise WireError(
            "'top_logprobs' is not supported: the gateway returns the logprob of each sampled token", "top_logprobs"
        )
    _refuse_response_format(body.get("response_format"))
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, Mapping):
        raise WireError("'stream_options' must be an object", "stream_options")
    tool_choice, tool_name = _tool_choice(body.get("tool_choice"), tools)
    return ChatRequest(
        model=_optional(body, "model", str),
        messages=_messages(messages, known),
        tools=tuple(tools),
        tool_choice=tool_choice,
        tool_name=tool_name,
        stream=bool(body.get("stream", False)),
        include_usage=bool(stream_options.get("include_usage", False)),
        n=n,
        logprobs=bool(body.get("logprobs", False)),
        max_tokens=integer_field(body, "max_completion_tokens", None, 1) or integer_field(body, "max_tokens", None, 1),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0, open_low=True),
        seed=integer_field(body, "seed", None),
        stop=_stop(body.get("stop")),
        tools_key=json.dumps(tools, sort_keys=True) if tools else "",
    )


def _messages(messages: list[Any], known: tuple[Sequence[Any], Sequence[WireMessage]]) -> tuple[WireMessage, ...]:
    raw_known, parsed_known = known
    same = 0
    for mine, theirs in zip(messages, raw_known):
        if mine != theirs:
            break
        same += 1
    return (*parsed_known[:same], *(_message(m, i) for i, m in enumerate(messages[same:], same)))


def _message(raw: Any, index: int) -> WireMessage:
    where = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise WireError(f"{where} must be an object, got {type(raw).__name__}", where)
    role = raw.get("role")
    role = "system" if role == "developer" else role
    if role not in ("system", "user", "assistant", "tool"):
        raise WireError(
            f"{where}.role {role!r} is not one of system, developer, user, assistant, tool", f"{where}.role"
        )
    calls = raw.get("tool_calls") or []
    if role != "assistant" and calls:
        raise WireError(f"{where}: only assistant messages carry tool_calls", f"{where}.tool_calls")
    tool_call_id = raw.get("tool_call_id")
    if role == "tool" and not isinstance(tool_call_id, str):
        raise WireError(
            f"{where}: a tool message needs the string 'tool_call_id' of the call it answers", f"{where}.tool_call_id"
        )
    name = raw.get("name")
    content, images = message_content(raw.get("content"), where, role)
    return WireMessage(
        role=role,
        content=content,
        tool_calls=tuple(_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(calls)),
        tool_call_id=tool_call_id if role == "tool" else None,
        name=name if isinstance(name, str) and role == "tool" else None,
        images=images,
    )


def _call(raw: Any, where: str) -> WireCall:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise WireError(f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', where)
    return WireCall(str(raw.get("id") or ""), function["name"], canonical_arguments(function.get("arguments")))


def canonical_arguments(arguments: Any) -> str:
    """Arguments as canonical JSON text (a client may re-serialise them with other spacing)."""
    if isinstance(arguments, str):
        return _canonical_text(arguments)
    return json.dumps(arguments if arguments is not None else {}, sort_keys=True, ensure_ascii=False)


@functools.lru_cache(maxsize=8192)
def _canonical_text(arguments: str) -> str:
    """Cached: every request repeats the calls of the conversation so far."""
    try:
        value = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError):
        return arguments
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _is_function_tool(tool: Any) -> bool:
    return (
        isinstance(tool, Mapping)
        and tool.get("type") == "function"
        and isinstance(tool.get("function"), Mapping)
        and isinstance(tool["function"].get("name"), str)
    )


def _tool_choice(value: Any, tools: list[Any]) -> tuple[str, str | None]:
    """(the choice, the named function or None); a choice that needs tools needs them offered."""
    if value is None or value in ("auto", "none"):
        return value or "auto", None
    named = value.get("function") if isinstance(value, Mapping) and value.get("type") == "function" else None
    if value != "required" and not (isinstance(named, Mapping) and isinstance(named.get("name"), str)):
        if isinstance(value, Mapping) and value.get("type") in ("allowed_tools", "custom"):
            raise WireError(
                f"'tool_choice' {value!r} is not honoured: the gateway forces a call to one function or to "
                f"any; send 'auto', 'required', 'none' or {{\"type\": \"function\", ...}}",
                "tool_choice",
            )
        raise WireError(
            f"'tool_choice' {value!r} is not 'auto', 'none', 'required' or {{\"type\": \"function\", ...}}",
            "tool_choice",
        )
    names = [t["function"]["name"] for t in tools]
    if named is None:
        if not names:
            raise WireError("'tool_choice' 'required' needs 'tools': there is no tool to call", "tool_choice")
        return "required", None
    if named["name"] not in names:
        raise WireError(
            f"'tool_choice' names the function {named['name']!r}, which is not one of the tools {names}", "tool_choice"
        )
    return "function", named["name"]


def _refuse_response_format(value: Any) -> None:
    """Only plain text is honoured: a schema or JSON mode would need constrained decoding."""
    if value is not None and value != {"type": "text"}:
        raise WireError(
            f"'response_format' {value!r} is not honoured: the gateway does not constrain decoding; "
            f'leave it out (or send {{"type": "text"}}) and parse the reply\'s text',
            "response_format",
        )


def _optional(body: Mapping[str, Any], key: str, kind: type) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise WireError(f"'{key}' must be a {kind.__name__}, got {value!r}", key)
    return value


def integer_field(
    body: Mapping[str, Any], key: str, default: int | None, low: int | None = None, high: int | None = None
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or (low is not None and value < low)
        or (high is not None and value > high)
    ):
        bounds = f" between {low} and {high}" if high is not None else (f" >= {low}" if low is not None else "")
        raise WireError(f"'{key}' must be an integer{bounds}, got {value!r}", key)
    return value


def _number(body: Mapping[str, Any], key: str, low: float, high: float, open_low: bool = False) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (open_low and value == low):
        raise WireError(f"'{key}' must be a number in {'(' if open_low else '['}{low}, {high}], got {value!r}", key)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 4:
        return tuple(value)
    raise WireError(f"'stop' must be a string or a list of at most 4 strings, got {value!r}", "stop")


# -- responses ---------------------------------------------------------------------------------


def completion_body(
    request_id: str, model: str, created: int, choices: Sequence[Choice], prompt_tokens: int
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": i, "message": _message_json(c), "finish_reason": c.finish_reason, "logprobs": _logprobs_json(c)}
            for i, c in enumerate(choices)
        ],
        "usage": _usage(choices, prompt_tokens),
    }


def stream_chunks(
    request_id: str, model: str, created: int, choices: Sequence[Choice], prompt_tokens: int, include_usage: bool
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order (without ``[DONE]``)."""

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}],
        }

    for i, c in enumerate(choices):
        yield chunk(i, {"role": "assistant", "content": ""})
        if c.content:
            yield chunk(i, {"content": c.content}, logprobs=_logprobs_json(c))
        for k, call in enumerate(c.tool_calls):
            yield chunk(i, {"tool_calls": [{"index": k, **call.to_json()}]})
        yield chunk(i, {}, c.finish_reason)
    if include_usage:
        yield {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(choices, prompt_tokens),
        }


def models_body(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "rollforge"}]}


def _message_json(choice: Choice) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": choice.content}
    if choice.tool_calls:
        out["tool_calls"] = [c.to_json() for c in choice.tool_calls]
    return out


def _logprobs_json(choice: Choice) -> dict[str, Any] | None:
    if choice.logprobs is None:
        return None
    return {
        "content": [
            {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []}
            for token, logprob in choice.logprobs
        ]
    }


def _usage(choices: Sequence[Choice], prompt_tokens: int) -> dict[str, int]:
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
