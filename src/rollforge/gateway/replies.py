"""A gateway session's translations between the two forms of its conversation, with no state of
their own: the wire form (``WireMessage``, what the client sees and sends back) and the template
form (``Message``, what the chat template renders and the model saw).

- ``build_reply``: a generated completion becomes a ``Reply``: its template message (the raw
  generated text, with the tool calls parsed from it, each given an id unique in the session) and
  its wire message (the text a client sees, without the calls' markup, and the calls with canonical
  arguments). Calls that do not parse are returned as failures.
- ``reply_choice``: a ``Reply`` as a chat-completion ``Choice`` (finish reason, logprobs).
- ``template_messages``: a request's wire messages as the template renders them: replies the
  gateway sent keep their raw text (the session passes the ones it sent), tool results are named
  after the calls they answer, and user and tool messages keep the images the client sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser
from ..types import Completion, Failure, Message, ToolCall
from .wire import ChatRequest, Choice, WireCall, WireMessage, canonical_arguments


@dataclass(frozen=True)
class Reply:
    """A reply sent and not yet continued: its wire form, template form, the tokens forced before
    the generation (mask 0) and the generated ones."""

    wire: WireMessage
    message: Message
    forced: list[int]
    ids: list[int]
    logprobs: tuple[float, ...]


def build_reply(
    renderer: ChatRenderer,
    parser: ToolCallParser,
    request: ChatRequest,
    forced: list[int],
    completion: Completion,
    ids_from: tuple[int, int, int],
) -> tuple[Reply, list[Failure]]:
    """The reply of ``completion`` (after the ``forced`` ids) to ``request``, and the calls that did
    not parse. ``ids_from``: (session seed, turn, choice index), from which calls without an id get
    one unique in the session (choice k of turn t numbers its calls from 1000 k)."""
    generated = list(completion.token_ids)
    text = renderer.decode(renderer.content_ids(forced + generated))
    calls: tuple[ToolCall, ...] = ()
    failures: list[Failure] = []
    if request.tools and request.tool_choice != "none":
        parsed = parser.parse(text)
        failures = [Failure("tool_invalid_json", c.error) for c in parsed if c.error is not None]
        seed, turn, k = ids_from
        calls = tuple(
            ToolCall(c.name, c.arguments, c.id or renderer.family.call_id(seed, turn, 1000 * k + j))
            for j, c in enumerate(x for x in parsed if x.error is None)
        )
    message = Message("assistant", text, tool_calls=calls)
    wire_calls = tuple(WireCall(c.id, c.name, canonical_arguments(dict(c.arguments))) for c in calls)
    wire = WireMessage("assistant", _visible_text(text, message, renderer), wire_calls)
    return Reply(wire, message, forced, generated, completion.logprobs), failures


def reply_choice(renderer: ChatRenderer, request: ChatRequest, reply: Reply, completion: Completion) -> Choice:
    """``reply`` as the client receives it: its content and calls, why it finished, and with
    ``logprobs`` requested each content token's (a forced token had no choice: logprob 0)."""
    if reply.wire.tool_calls:
        finish = "tool_calls"
    else:
        finish = "length" if completion.finish_reason == "length" else "stop"
    logprobs = None
    if request.logprobs:
        content = renderer.content_ids(reply.forced + reply.ids)
        sampled = (0.0,) * len(reply.forced) + reply.logprobs
        logprobs = tuple((renderer.decode([t]), lp) for t, lp in zip(content, sampled))
    return Choice(
        reply.wire.content or None, reply.wire.tool_calls, finish, logprobs, len(reply.forced) + len(reply.ids)
    )


def template_messages(
    wire: Sequence[WireMessage], before: Sequence[WireMessage], ours: Mapping[WireMessage, Message]
) -> list[Message]:
    """Messages as the template renders them: replies the gateway sent (``ours``) keep their raw
    text; a tool result is named after the call it answers (in ``wire`` or the messages ``before``)."""
    names = (
        {c.id: c.name for m in (*before, *wire) for c in m.tool_calls} if any(m.role == "tool" for m in wire) else {}
    )
    out = []
    for m in wire:
        if m.role == "assistant":
            sent = ours.get(m)
            out.append(sent if sent is not None else _client_reply(m))
        elif m.role == "tool":
            name = m.name or names.get(m.tool_call_id)
            out.append(Message("tool", m.content, name=name, images=m.images, tool_call_id=m.tool_call_id))
        else:
            out.append(Message(m.role, m.content, images=m.images))
    return out


def _client_reply(m: WireMessage) -> Message:
    """An assistant message the gateway did not send (the client wrote or rewrote it)."""
    calls = tuple(ToolCall(c.name, _arguments(c.arguments), c.id or None) for c in m.tool_calls)
    return Message("assistant", m.content, tool_calls=calls)


def _visible_text(text: str, message: Message, renderer: ChatRenderer) -> str:
    """The content a client sees: all of the text when there is no call; else the text before
    the calls' markup (what the family's template takes as content, for families that render
    calls themselves; the text before ``<tool_call>`` otherwise; nothing when the whole message
    is the call, as with Llama's JSON)."""
    if not message.tool_calls:
        return text
    if renderer.family.structured_calls:
        return renderer.family.assistant_chat(text, message.to_chat().get("tool_calls")).get("content") or ""
    opener = text.find("<tool_call>")
    return text[:opener].strip() if opener >= 0 else ""


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
