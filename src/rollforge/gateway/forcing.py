"""Forced tool-call openers: how the gateway honours ``tool_choice`` ``required`` or a named function.

Decoding is not constrained. Instead the gateway starts the reply for the model: the family's
tool-call opener is appended to the prompt as **forced** tokens, and the policy generates the rest.
The forced tokens are part of the reply (its text, what is parsed, what the client gets back) and
of the recorded segment, under mask 0 with no logprob: the policy did not sample them, so they are
out of the loss::

    ids  = ... | gen-prompt | forced opener (mask 0) | generated (mask 1) | closing + new messages | ...

The opener is read off the family's own writing of a call (the template's rendering for families
that render calls themselves, else the parser's ``write``): for ``required`` everything before the
tool's name (Hermes: ``<tool_call>\\n{"name": "``), for a named function everything up to where
its arguments start (``<tool_call>\\n{"name": "add", "arguments": {``). A format with no text before
the name, or whose written call the parser does not read back, has no clean opener: the request
is refused with a 400 naming ``tool_choice``. A forced reply has no reasoning: in families that
reason (Qwen3, DeepSeek-R1) the forced tokens start with an empty reasoning block, as the family's
templates render a reply without reasoning (``ChatRenderer.reasoning_text("")``; only its closing
tag when the generation prompt opens it).
"""

from __future__ import annotations

import os
from typing import Any

from ..chat.render import ChatRenderer
from ..errors import TemplateError, WireError
from ..types import ToolCall

_PROBE_TOOL = "rollforge_probe_tool"
_PROBE_ARGUMENT = "rollforge_probe_argument"
#: Where a named opener may end (back off to one of these, so it does not stop inside a word or tag).
_BOUNDARIES = "\n{[ >"


def forced_opener(renderer: ChatRenderer, parser: Any, tool: str | None) -> list[int]:
    """The ids that start a call to ``tool`` (None: to any tool, for ``required``); a ``WireError``
    naming ``tool_choice`` when the family's call format has no clean opener."""
    called = tool or _PROBE_TOOL
    bare, with_argument = (
        _written(renderer, parser, ToolCall(called, arguments)) for arguments in ({}, {_PROBE_ARGUMENT: 0})
    )
    name_at = bare.find(called)
    cut = name_at
    if tool is not None and name_at >= 0:
        cut = len(os.path.commonprefix([bare, with_argument]))
        while cut > name_at + len(called) and bare[cut - 1] not in _BOUNDARIES:
            cut -= 1
    opener = bare[:cut] if cut > 0 else ""
    ids = renderer.encode(renderer.reasoning_text("") + opener)  # no reasoning before a forced call
    calls = parser.parse(bare)
    readable = len(calls) == 1 and calls[0].name == called and calls[0].error is None
    if not opener or not readable or not renderer.decode(ids).endswith(opener):
        raise _refused(renderer, tool, f"its written call {bare!r} has no clean opener before the tool's name")
    return ids


def _written(renderer: ChatRenderer, parser: Any, call: ToolCall) -> str:
    try:
        return renderer.call_text(call) if renderer.family.structured_calls else parser.write(call)
    except (TemplateError, ValueError, TypeError) as exc:
        raise _refused(renderer, call.name, f"writing a call failed: {exc}") from None


def _refused(renderer: ChatRenderer, tool: str | None, why: str) -> WireError:
    choice = "'required'" if tool is None else f"the function {tool!r}"
    return WireError(
        f"'tool_choice' {choice} cannot be honoured for the {renderer.family.name} family: {why}; "
        "send 'auto' or 'none'",
        "tool_choice",
    )
