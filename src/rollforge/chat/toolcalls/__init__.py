"""Parsing tool calls out of generated text, one parser per model family.

Design: the engine keeps an assistant message's raw text as its content (so the conversation
re-renders to exactly the tokens the policy produced) and asks a ``ToolCallParser`` for the calls
written in it. A parser never raises on model output and reads it in time linear in its length,
whatever it holds: a call it cannot read becomes a ``ToolCall(name=..., arguments={}, error=...)``
(with the tool name whenever it is readable) that the environment reports back to the model as a
counted failure. JSON is decoded strictly (``decoding.py``): ``NaN``/``Infinity``, numbers that
overflow a double, integers past Python's digit limit, nesting deeper than 64 levels and lone
surrogates are errors, never exceptions. At most 128 calls are read from one reply (the rest
become one error call). Parsers are stateless and cheap; ``get_parser(name)`` returns one by
family name. Each parser's ``markers`` lists the text that signals a call attempt, and ``write``
is its inverse: a call as the family's models write it (scripted policies, experts, the probe).

Each parser also writes the fallback system prompt for chat templates that ignore ``tools=``
(SmolLM2's ChatML does): the tools, the exact call format with an example, and the instruction to
answer without a tool call when done.

Families (one module each):

- ``hermes`` (alias ``qwen``, the default): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (Hermes, Qwen 2.5, Qwen 3, SmolLM3);
- ``llama3_json``: the whole message is one ``{"name": ..., "parameters": {...}}`` (Llama 3.x);
- ``mistral``: ``[TOOL_CALLS] [{"name", "arguments", "id"}]`` (v0.3, Nemo) and
  ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11+);
- ``qwen3_coder``: ``<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>``;
- ``deepseek``: DeepSeek V3/R1/V3.1 ``<｜tool▁call▁begin｜>`` tokens;
- ``harmony`` (alias ``gpt_oss``): GPT-OSS messages addressed ``to=functions.NAME``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from ...errors import ConfigError
from ...types import ToolCall
from .deepseek import DeepSeekParser
from .harmony import HarmonyParser
from .hermes import HermesParser
from .llama3 import Llama3JsonParser
from .mistral import MistralParser
from .qwen3_coder import Qwen3CoderParser


@runtime_checkable
class ToolCallParser(Protocol):
    """Reads the tool calls of one model family out of generated text."""

    #: Text whose presence in a reply means the model tried to call a tool (``parse`` decides
    #: whether it did, and reports a broken attempt as an error call).
    markers: tuple[str, ...]

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        """The calls in ``text``, in order; unreadable calls carry ``error``. Never raises."""
        ...

    def write(self, call: ToolCall) -> str:
        """``call`` as the family's models write it; ``parse`` reads it back."""
        ...

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """Instructions describing ``tools`` (OpenAI function format) and the call format."""
        ...


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "qwen3_coder": Qwen3CoderParser,
    "deepseek": DeepSeekParser,
    "harmony": HarmonyParser,
    "gpt_oss": HarmonyParser,
}

#: The names ``get_parser`` accepts.
PARSER_NAMES: tuple[str, ...] = tuple(sorted(_PARSERS))


def get_parser(name: str = "hermes") -> ToolCallParser:
    """The tool-call parser of a model family (see the module docstring)."""
    try:
        factory = _PARSERS[name]
    except (KeyError, TypeError):
        valid = ", ".join(PARSER_NAMES)
        raise ConfigError(f"unknown tool-call parser {name!r}; valid names: {valid}") from None
    return factory()


__all__ = [
    "PARSER_NAMES",
    "DeepSeekParser",
    "HarmonyParser",
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "Qwen3CoderParser",
    "ToolCallParser",
    "get_parser",
]
