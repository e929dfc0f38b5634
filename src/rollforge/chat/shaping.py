"""What a model family's conventions (``chat/families.py``) make of rollforge's messages and of its
tokenizer's ids, before and apart from any template rendering:

- ``template_message``: the dict the chat template renders for one ``Message``: contents from
  outside the model escaped, a tool result in the family's shape (``tool_role``, ``tool_fields``),
  an assistant's calls passed to the template only for families that render them;
- ``with_fallback_tools``: the tool-call parser's description of the tools as the system prompt,
  after an existing one (for templates that ignore ``tools=``);
- ``system_in_first_user``: for families whose template refuses a system role (Gemma 2), the
  system text at the start of the first user message;
- ``turn_end_ids``: the token ids that end an assistant turn (the sampler's stop ids).

``ChatRenderer`` (``chat/render.py``) applies them; they keep no state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from ..types import Message
from .families import Family


def template_message(message: Message, family: Family, escape: Callable[[str], str]) -> dict[str, Any]:
    """The dict the template renders for ``message``, shaped for ``family``; contents from outside
    the model (every role but the assistant's) pass through ``escape``."""
    if message.role == "assistant":
        out = message.to_chat()
        calls = out.pop("tool_calls", None)
        if family.structured_calls:
            return {**out, **family.assistant_chat(message.content, calls)}
        return out
    out = {"role": message.role, "content": escape(message.content)}
    if message.role == "tool":
        out["role"] = family.tool_role
        if family.tool_role != "user":
            for key in family.tool_fields:
                if getattr(message, key) is not None:
                    out[key] = getattr(message, key)
    elif message.name is not None:
        out["name"] = message.name
    return out


def with_fallback_tools(messages: tuple[Message, ...], description: str) -> tuple[Message, ...]:
    """``messages`` with the tools' ``description`` as the system prompt: after the existing
    system prompt's text, or as a new first message."""
    if messages and messages[0].role == "system":
        return (Message("system", f"{messages[0].content}\n\n{description}"), *messages[1:])
    return (Message("system", description), *messages)


def system_in_first_user(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """``messages`` without a system message: its text opens the first user message, which keeps
    its images (or becomes one when the conversation does not go on with a user)."""
    if not messages or messages[0].role != "system":
        return messages
    system, rest = messages[0], messages[1:]
    if rest and rest[0].role == "user":
        return (replace(rest[0], content=f"{system.content}\n\n{rest[0].content}"), *rest[1:])  # its images too
    return (Message("user", system.content), *rest)


def turn_end_ids(tokenizer: Any, closing: Sequence[int], extra: Sequence[str] = ()) -> tuple[int, ...]:
    """Token ids that end an assistant turn: the first closing token when it is a special token
    (e.g. ``<|im_end|>``; never a plain newline), the eos token(s) and the family's ``extra``
    tokens that the vocabulary has."""
    special = set(getattr(tokenizer, "all_special_ids", ())) | set(tokenizer.get_added_vocab().values())
    ids: list[int] = []
    if closing and closing[0] in special:
        ids.append(closing[0])
    eos = getattr(tokenizer, "eos_token_id", None)
    for token in eos if isinstance(eos, (list, tuple)) else [eos]:
        if token is not None and token not in ids:
            ids.append(int(token))
    vocab = tokenizer.get_added_vocab()
    ids += [vocab[text] for text in extra if text in vocab and vocab[text] not in ids]
    return tuple(ids)
