"""Model families as data: one entry per family says how its chat template wants to be driven.

The renderer (``chat/render.py``) is generic; what differs between families lives here:

- ``parser``: the tool-call format the family's models write (``chat/toolcalls.get_parser`` name);
- ``tools``: how tool schemas reach the prompt. A template that renders ``tools=`` gets them; one
  that ignores them gets the parser's fallback description, placed where the template accepts it:
  a system message, or the first user message for templates that refuse a system role (Gemma 2);
- ``tool_role`` / ``tool_fields``: the shape of a tool-result message (Gemma has no tool role, so
  results are user turns; Mistral needs ``tool_call_id``);
- ``structured_calls``: the template renders an assistant's calls from ``tool_calls`` and its
  content holds only the text around them (Mistral, DeepSeek-V3, GPT-OSS); otherwise the raw
  generated text, call markup included, is the content and ``tool_calls`` is not passed (so the
  template cannot render the calls a second time);
- ``call_ids``: how ids are made for calls whose format carries none (Mistral: 9 alphanumerics);
- ``template_kwargs`` / ``keep_reasoning``: options passed to the template, and the ones that make
  it keep past reasoning (a training-time choice; inference templates usually drop it);
- ``drops_reasoning``: whether the template rewrites past assistant turns (then episodes continue
  in new segments where it does).

A family is detected from the tokenizer's template text (``detect_family``; ChatML when no family's
markers match, which ``matched_family`` tells apart) or named (``get_family``); detection only picks
defaults, the start-up check then verifies the template.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

from ..errors import ConfigError


@dataclass(frozen=True)
class Family:
    name: str
    #: What users know it as.
    models: str
    #: ``get_parser`` name of the family's tool-call format.
    parser: str
    #: Substrings of the chat template that identify the family (all must occur).
    markers: tuple[str, ...] = ()
    #: Where a system prompt (and the fallback tool description) goes: a system message, or merged
    #: into the first user message for templates that refuse a system role.
    system: Literal["system", "first_user"] = "system"
    #: The role a tool result is rendered with.
    tool_role: str = "tool"
    #: Tool-message keys the template reads besides role and content.
    tool_fields: tuple[str, ...] = ("name", "tool_call_id")
    #: The template renders an assistant's tool calls from ``tool_calls`` (see the module docstring).
    structured_calls: bool = False
    #: Ids of calls whose format carries none: ``call`` -> ``call_<episode>_<turn>_<k>``;
    #: ``alnum9`` -> 9 alphanumerics (Mistral's templates reject anything else).
    call_ids: Literal["call", "alnum9"] = "call"
    #: Passed to the template on every rendering.
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: Passed too when the renderer is asked to keep past reasoning (``keep_reasoning=True``).
    keep_reasoning: Mapping[str, Any] = field(default_factory=dict)
    #: The template drops past reasoning (episodes may need several segments).
    drops_reasoning: bool = False
    #: The reasoning block the family's models write, (open, close), or None.
    reasoning: tuple[str, str] | None = None
    #: With ``structured_calls``: where the calls start in generated text (the content the template
    #: gets is the text before it; None when that is empty and ``empty_content`` is None).
    call_start: str | None = None
    #: What the template wants as the content of an assistant message that only calls tools.
    empty_content: str | None = ""
    #: How ``tool_calls`` arguments reach the template: a dict, or a JSON string (OpenAI's wire form).
    arguments: Literal["dict", "json"] = "dict"
    #: Tokens that end a generation besides the template's end of turn and eos (GPT-OSS ends a
    #: tool call with ``<|call|>``, Llama with ``<|eom_id|>``).
    stop_tokens: tuple[str, ...] = ()
    #: Harmony channels: an assistant reply's analysis goes to ``thinking``, its final message to
    #: ``content`` (the template raises on channel markup in either).
    channels: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "template_kwargs", MappingProxyType(dict(self.template_kwargs)))
        object.__setattr__(self, "keep_reasoning", MappingProxyType(dict(self.keep_reasoning)))

    def call_id(self, episode: int, turn: int, k: int) -> str:
        """A deterministic id for the ``k``-th call of a turn, in the family's accepted form."""
        if self.call_ids == "alnum9":
            digest = hashlib.sha1(f"{episode}/{turn}/{k}".encode()).digest()
            alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
            return "".join(alphabet[b % len(alphabet)] for b in digest[:9])
        return f"call_{episode}_{turn}_{k}"

    def assistant_chat(self, text: str, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The template's fields of an assistant message whose generated text is ``text`` and
        whose parsed calls are ``calls`` (OpenAI shape), for families with ``structured_calls``."""
        out: dict[str, Any] = {"role": "assistant"}
        if self.channels:
            thinking, final = _harmony_parts(text)
            if calls:
                final = ""
            out["content"] = final
            if thinking:
                out["thinking"] = thinking
        else:
            content = text
            if calls and self.call_start and self.call_start in text:
                content = text[: text.index(self.call_start)]
            out["content"] = self.empty_content if calls and not content else content
        if calls:
            if self.arguments == "json":
                calls = [
                    {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                    for c in calls
                ]
            out["tool_calls"] = calls
        return out


def _harmony_parts(text: str) -> tuple[str, str]:
    """(analysis, final) bodies of a harmony reply (the rest -- calls -- comes from the parser)."""
    thinking, final = [], []
    for block in text.split("<|channel|>")[1:]:
        header, _, body = block.partition("<|message|>")
        for end in ("<|end|>", "<|return|>", "<|call|>", "<|start|>"):
            body = body.split(end)[0]
        channel = header.split()[0] if header.split() else ""
        if "to=" in header:
            continue
        (thinking if channel == "analysis" else final if channel == "final" else []).append(body)
    return "\n".join(thinking), "\n".join(final)


_THINK = ("<think>", "</think>")

#: In detection order: the first family whose markers all occur in the template wins.
FAMILIES: tuple[Family, ...] = (
    Family(
        "gpt_oss",
        "GPT-OSS (harmony)",
        "harmony",
        ("<|channel|>", "<|start|>"),
        structured_calls=True,
        channels=True,
        stop_tokens=("<|call|>",),
        template_kwargs={"reasoning_effort": "medium"},
        drops_reasoning=True,
    ),
    Family(
        "mistral",
        "Mistral v0.3 / Nemo / Small",
        "mistral",
        ("[INST]",),
        structured_calls=True,
        call_ids="alnum9",
        call_start="[TOOL_CALLS]",
    ),
    Family(
        "deepseek",
        "DeepSeek-V3 / R1 / R1-Distill",
        "deepseek",
        ("<｜Assistant｜>",),
        structured_calls=True,
        drops_reasoning=True,
        reasoning=_THINK,
        call_start="<｜tool▁calls▁begin｜>",
        empty_content=None,
        arguments="json",
    ),
    Family("llama3", "Llama 3.1 / 3.2 / 3.3", "llama3_json", ("<|start_header_id|>",), stop_tokens=("<|eom_id|>",)),
    Family(
        "gemma2",
        "Gemma 2 (no system role)",
        "hermes",
        ("<start_of_turn>", "System role not supported"),
        system="first_user",
        tool_role="user",
        tool_fields=(),
    ),
    Family("gemma3", "Gemma 3", "hermes", ("<start_of_turn>",), tool_role="user", tool_fields=()),
    Family("phi4", "Phi-4", "hermes", ("<|im_sep|>",)),
    Family(
        "qwen3_5",
        "Qwen3.5 / 3.6 / 3.8",
        "qwen3_coder",
        ("<|im_start|>", "<function=", "<think>"),
        keep_reasoning={"preserve_thinking": True},
        drops_reasoning=True,
        reasoning=_THINK,
    ),
    Family("qwen3_coder", "Qwen3-Coder", "qwen3_coder", ("<|im_start|>", "<function="), reasoning=None),
    Family(
        "qwen3",
        "Qwen3",
        "hermes",
        ("<|im_start|>", "<think>"),
        template_kwargs={"enable_thinking": True},
        keep_reasoning={"preserve_thinking": True},
        drops_reasoning=True,
        reasoning=_THINK,
    ),
    Family("qwen2_5", "Qwen2.5", "hermes", ("<|im_start|>", "<tool_call>")),
    Family("chatml", "ChatML: SmolLM2, SmolLM3, Hermes", "hermes", ("<|im_start|>",)),
)

_BY_NAME = {f.name: f for f in FAMILIES}
_ALIASES = {
    "smollm": "chatml",
    "qwen2": "qwen2_5",
    "harmony": "gpt_oss",
    "llama": "llama3",
    "deepseek_v3": "deepseek",
    "deepseek_r1": "deepseek",
    "gemma": "gemma3",
}
FAMILY_NAMES: tuple[str, ...] = tuple(sorted([*_BY_NAME, *_ALIASES]))


def get_family(name: str) -> Family:
    """The family called ``name`` (see ``FAMILY_NAMES``)."""
    family = _BY_NAME.get(_ALIASES.get(name, name)) if isinstance(name, str) else None
    if family is None:
        raise ConfigError(f"unknown model family {name!r}; valid names: {', '.join(FAMILY_NAMES)}")
    return family


def detect_family(template: str | None) -> Family:
    """The family a chat template belongs to, from its text; ChatML when no family matches."""
    return matched_family(template) or _BY_NAME["chatml"]


def matched_family(template: str | None) -> Family | None:
    """The first family whose markers all occur in the template, or None (``detect_family`` then
    falls back to ChatML, a guess the start-up check verifies)."""
    text = template or ""
    return next((f for f in FAMILIES if f.markers and all(m in text for m in f.markers)), None)
