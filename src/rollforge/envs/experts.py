"""Expert policies: scripted players of the bundled environments, for demonstrations.

An expert is a plain function ``expert(messages, parser) -> reply``: it reads the conversation so
far (the same ``Message`` tuple the environment sees) and writes the assistant's next reply as
text. A reply that calls a tool is written in the tool-call format of ``parser`` (a parser from
``rollforge.chat.toolcalls.get_parser``), so demonstrations teach the format of the model family
being trained. Experts know nothing of tokens: the demonstrations are rolled out through the normal
engine with a scripted backend (``rollforge.recipes.sft_data.expert_demonstrations``), which makes
their token ids and loss masks exactly those of a policy rollout.

``format_tool_call`` writes one call in a parser's format; it round-trips through ``parser.parse``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..chat.toolcalls import ToolCallParser
from ..errors import ConfigError
from ..types import Message, ToolCall

#: ``expert(messages, parser) -> reply text``.
Expert = Callable[[Sequence[Message], ToolCallParser], str]


def format_tool_call(parser: ToolCallParser, name: str, arguments: Mapping[str, Any]) -> str:
    """One tool call as a model of ``parser``'s family writes it (``parser.write``)."""
    if not callable(getattr(parser, "write", None)):  # a user's own parser may predate ``write``
        raise ConfigError(
            f"experts cannot write tool calls for parser {type(parser).__name__}: it has no "
            "write(call) method (see rollforge.chat.toolcalls.ToolCallParser)"
        )
    return parser.write(ToolCall(name, dict(arguments)))


def last_matching(messages: Sequence[Message], needle: str) -> str | None:
    """The content of the last message containing ``needle`` (None when there is none)."""
    return next((m.content for m in reversed(messages) if needle in m.content), None)
