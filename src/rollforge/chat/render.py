"""Incremental chat-template rendering: token ids for each new turn, never the whole conversation.

A conversation's token ids are built once and only appended to:

    prompt_ids(messages)            the opening messages, rendered by the chat template once
    generation_prompt               e.g. ``<|im_start|>assistant\\n`` before each generation
    <generated ids>                 kept exactly as the backend returned them (policy tokens)
    closing_ids(generated)          what the template puts after an assistant message's content
                                    (``<|im_end|>\\n``) minus what the model already generated
    delta_ids(new messages)         tool results / observations rendered after an assistant turn

``delta_ids`` renders the new messages behind a fixed two-message base conversation and keeps the
text past the base (one small template call and one tokenization per turn, independent of the
conversation's length). This is exact for templates that are *prefix-preserving*: rendering a
longer conversation only appends to the text of a shorter one.

``check_template`` (``chat/template_check.py``) finds out, per set of tools, on a probe
conversation whether the turn-by-turn ids equal the whole rendering's. When they do not -- the
template rewrites history, e.g. drops past reasoning -- the report says ``incremental=False`` and
episodes continue in *segments*: each turn the whole conversation is rendered; when the ids so far
are a prefix of it the new part is appended, otherwise a new segment starts whose prompt is that
rendering (``rollout/episode.py``).

Injection safety (``chat/encoding.py``): text from datasets, environments and tools (system, user
and tool contents) is escaped before rendering, and only the template's own markup becomes control
tokens. Assistant contents are the model's own text.

Families (``chat/families.py``) supply the template options, the tool-message shape, where system
prompts and the fallback tool description go (templates that ignore ``tools=``, such as SmolLM2's
ChatML, get the tool-call parser's description of the tools, see ``with_tool_prompt``);
``chat/shaping.py`` applies them to messages and finds the ids that end a turn.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

from ..arguments import check_tokenizer
from ..errors import TemplateError
from ..types import Message, ToolCall
from . import template_check
from .encoding import SafeEncoder
from .families import Family, detect_family, get_family
from .fidelity import first_difference as _first_difference
from .fidelity import token_fidelity_gap  # noqa: F401  (re-exported: rollforge.chat.render.token_fidelity_gap)
from .shaping import system_in_first_user, template_message, turn_end_ids, with_fallback_tools
from .template_check import TemplateReport
from .toolcalls import get_parser

_SENTINEL = "\u27e6rollforge-sentinel\u27e7"
_BASE_USER = "u"


class ChatRenderer:
    """Renders conversations of one tokenizer's chat template into token ids incrementally.

    ``family``: a ``chat/families.py`` name or ``Family`` (default: detected from the template).
    ``keep_reasoning``: pass the family's keep-past-reasoning template options (training-time
    rendering; the inference template drops past reasoning, see the README)."""

    #: What the model's processor makes of images (``images.ImageProcessing``) for a renderer that
    #: renders them (``chat/vision.py``); None: text only.
    images: Any = None

    def __init__(self, tokenizer: Any, family: str | Family | None = None, *, keep_reasoning: bool = False):
        check_tokenizer(tokenizer, "ChatRenderer", needs=("encode", "decode", "apply_chat_template"))
        if getattr(tokenizer, "chat_template", None) is None:
            raise TemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; "
                "rollforge renders conversations with the tokenizer's chat template"
            )
        self.tokenizer = tokenizer
        if family is None:
            family = detect_family(tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None)
        self.family = get_family(family) if isinstance(family, str) else family
        self.template_kwargs = {**self.family.template_kwargs, **(self.family.keep_reasoning if keep_reasoning else {})}
        self._encoding = SafeEncoder(tokenizer)
        self.control_token_ids = self._encoding.control_token_ids
        user_only = [{"role": "user", "content": _BASE_USER}]
        without = self._text(user_only, add_generation_prompt=False)
        with_prompt = self._text(user_only, add_generation_prompt=True)
        if not with_prompt.startswith(without):
            raise TemplateError("the chat template's generation prompt does not extend the conversation")
        self.generation_prompt = self.encode(with_prompt[len(without) :])
        base = self._text([*user_only, {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False)
        if _SENTINEL not in base:
            raise TemplateError("the chat template does not render assistant content verbatim")
        self._closing_text = base[base.index(_SENTINEL) + len(_SENTINEL) :]
        self.closing = self.encode(self._closing_text)
        self.stop_token_ids = turn_end_ids(tokenizer, self.closing, self.family.stop_tokens)
        self._base_cache: dict[str, str] = {}
        self._supports_tools: bool | None = None
        self._prompt_cache: dict[tuple, tuple] = {}
        self._frames: dict[tuple, tuple] = {}  # (role, name, has an id, tools) -> text before/after content
        self._memos: dict[tuple, tuple] = {}  # ids of objects -> (the objects, a value derived from them)
        self._reports: dict[str, TemplateReport | TemplateError] = {}  # tools key -> what the check found

    # -- text and ids ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: special-token text is a control token, except where content
        was escaped (see ``chat/encoding.py``), which is tokenized as plain text."""
        return self._encoding.encode(text)

    def escape(self, text: str) -> str:
        """``text`` with every special token's text replaced by its private-use escape, except in
        the fallback tool descriptions this renderer wrote (rollforge's own text, whose call-format
        tokens the model must see as the tokens it is to write)."""
        return self._encoding.escape(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode(ids)

    def _text(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                list(messages),
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja errors carry the template's own message
            roles = [m.get("role") for m in messages]
            raise TemplateError(f"the chat template failed on roles {roles}: {exc}") from exc

    def chat(self, message: Message) -> dict[str, Any]:
        """The dict the template renders for ``message``, shaped for the family
        (``shaping.template_message``); contents from outside the model are escaped."""
        return template_message(message, self.family, self.escape)

    def _render(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = (), add_generation_prompt: bool = False
    ) -> str:
        return self._text([self.chat(m) for m in messages], add_generation_prompt, tools)

    def render_text(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = (), add_generation_prompt: bool = False
    ) -> str:
        """The whole conversation as the template renders it (for checks, not for rollouts)."""
        return self._encoding.unescape(self._render(messages, tools, add_generation_prompt))

    def conversation_ids(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = (), add_generation_prompt: bool = False
    ) -> list[int]:
        """The ids of the whole conversation as the template renders it (injection-safe): a
        segment's prompt, and the reference every segment is checked against."""
        return self.encode(self._render(messages, tools, add_generation_prompt))

    # -- incremental pieces -----------------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        """The opening messages, without the generation prompt.

        Prompts of one environment usually share everything but the last message (a long system
        prompt describing the tools). That shared part is rendered and tokenized once; the last
        message is then framed by the text the template puts around its content. Both shortcuts are
        checked once against a full rendering and dropped for templates where they do not hold."""
        if len(messages) < 2 or any(m.images for m in messages):  # the shortcuts frame text only
            return self.conversation_ids(messages, tools)
        last = messages[-1]
        key = (tuple((m.role, m.content, m.name) for m in messages[:-1]), self._tools_key(tools), last.role, last.name)
        shortcut = self._prompt_cache.get(key)
        if shortcut is None:
            if len(self._prompt_cache) >= 256:
                self._prompt_cache.clear()
            shortcut = self._prompt_cache[key] = self._prompt_shortcut(messages, tools)
        if not shortcut or last.role == "assistant":
            return self.conversation_ids(messages, tools)
        prefix_ids, before, after = shortcut
        return prefix_ids + self.encode(before + self.escape(last.content) + after)

    def _prompt_shortcut(self, messages: Sequence[Message], tools) -> tuple[list[int], str, str] | tuple[()]:
        """(ids of all but the last message, text before and after the last message's content),
        when tokenizing those pieces reproduces the full rendering exactly; else ``()``."""
        try:
            prefix = self._render(messages[:-1], tools)
        except TemplateError:  # some templates refuse a conversation without a user message
            return ()
        last = messages[-1]
        probe = self._render([*messages[:-1], Message(last.role, _SENTINEL, name=last.name)], tools)
        if not probe.startswith(prefix) or probe.count(_SENTINEL) != 1:
            return ()
        before, after = probe[len(prefix) :].split(_SENTINEL)
        prefix_ids = self.encode(prefix)
        full = self._render(messages, tools)
        if full != prefix + before + self.escape(last.content) + after:
            return ()
        if prefix_ids + self.encode(before + self.escape(last.content) + after) != self.encode(full):
            return ()
        return prefix_ids, before, after

    def closing_ids(self, generated: Sequence[int]) -> list[int]:
        """Tokens that end an assistant turn after ``generated``: the template's closing text minus
        the part of it the model already produced (usually its end-of-turn token)."""
        closing = self.closing
        for k in range(min(len(closing), len(generated)), 0, -1):
            if list(generated[-k:]) == closing[:k]:
                return closing[k:]
        return list(closing)

    def content_ids(self, generated: Sequence[int]) -> list[int]:
        """The generated ids without the trailing part of the closing text (the message content)."""
        kept = len(self.closing) - len(self.closing_ids(generated))
        return list(generated[: len(generated) - kept]) if kept else list(generated)

    def delta_ids(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        """Tokens for ``messages`` appended after a closed assistant turn (no generation prompt)."""
        if not messages:
            return []
        key = self._tools_key(tools)
        framed = len(messages) == 1 and not messages[0].images  # a frame holds text only
        if framed:
            shape = (messages[0].role, messages[0].name, messages[0].tool_call_id is None, key)
            frame = self._frames.get(shape)
            if frame:
                return self.encode(frame[0] + self.escape(messages[0].content) + frame[1])
        text = self._delta_text(messages, tools, key)
        if framed and shape not in self._frames:
            self._frames[shape] = self._frame(messages[0], tools, key, text)
        return self.encode(text)

    def _delta_text(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], key: str) -> str:
        base_msgs = [{"role": "user", "content": _BASE_USER}, {"role": "assistant", "content": _BASE_USER}]
        base = self._base_cache.get(key)
        if base is None:
            if len(self._base_cache) >= 64:
                self._base_cache.clear()
            base = self._base_cache[key] = self._text(base_msgs, False, tools)
        full = self._text(base_msgs + [self.chat(m) for m in messages], False, tools)
        if not full.startswith(base):
            raise TemplateError(
                f"the chat template is not prefix-preserving: adding {[m.role for m in messages]} "
                "messages changes the text before them "
                f"({_first_difference(base, full, 'base', 'base + new messages')})"
            )
        return full[len(base) :]

    def _frame(self, message: Message, tools, key: str, rendered: str) -> tuple[str, str] | tuple[()]:
        """The text the template puts around one message of this role and name, when it renders the
        content verbatim between them and does not depend on the call id (checked against real
        renderings); else ``()``: always render."""
        if len(self._frames) >= 256:
            self._frames.clear()
        probes = {
            self._delta_text([Message(message.role, _SENTINEL, name=message.name, tool_call_id=call_id)], tools, key)
            for call_id in {
                message.tool_call_id,
                None if message.tool_call_id is None else self.family.call_id(-1, -1, -1),
            }
        }
        probe = probes.pop()
        if probes or probe.count(_SENTINEL) != 1:
            return ()
        before, after = probe.split(_SENTINEL)
        return (before, after) if before + self.escape(message.content) + after == rendered else ()

    # -- tools and system prompts ---------------------------------------------------------------

    def parser(self, name: str | None = None) -> Any:
        """The tool-call parser named ``name`` (a config's or flag's ``tool_parser``), else the family's."""
        return get_parser(name or self.family.parser)

    def supports_tools(self) -> bool:
        """Whether the template renders ``tools=`` at all (SmolLM2's ChatML does not)."""
        probe = [{"role": "user", "content": _BASE_USER}]
        tool = {
            "type": "function",
            "function": {"name": "probe_tool_" + _SENTINEL, "description": "", "parameters": {}},
        }
        return self._text(probe, False, [tool]) != self._text(probe, False)

    def with_tool_prompt(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], parser: Any
    ) -> tuple[tuple[Message, ...], tuple[Mapping[str, Any], ...]]:
        """The messages and template tools to render for a conversation offering ``tools``.

        A template that renders ``tools=`` gets them as they are. Otherwise (the documented fallback)
        ``parser.system_prompt(tools)`` -- the tool-call parser's description of the tools and the
        call format -- becomes the system message, placed after an existing system prompt. The
        description is written once per tools tuple and parser (environment classes share one
        tools tuple across their episodes). Families whose template refuses a system role (Gemma
        2) get the system text at the start of the first user message instead."""
        template_tools: tuple[Mapping[str, Any], ...] = ()
        messages = tuple(messages)
        if tools:
            if self._supports_tools is None:
                self._supports_tools = self.supports_tools()
            if self._supports_tools:
                template_tools = tuple(tools)
            else:
                fallback = self._memo((tools, parser), lambda: self._encoding.trust(parser.system_prompt(tools)))
                messages = with_fallback_tools(messages, fallback)
        if self.family.system == "first_user":
            messages = system_in_first_user(messages)
        return messages, template_tools

    def _tools_key(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """A cache key for tool schemas (a JSON dump, computed once per tools tuple)."""
        if not tools:
            return ""
        return self._memo((tools,), lambda: json.dumps(list(tools), sort_keys=True, default=str))

    def _memo(self, objects: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()`` cached by the identity of ``objects``, which the cache keeps alive so that
        their ids cannot be reused by other objects."""
        key = tuple(map(id, objects))
        hit = self._memos.get(key)
        if hit is None:
            if len(self._memos) >= 256:
                self._memos.clear()
            hit = self._memos[key] = (objects, compute())
        return hit[1]

    # -- the check ---------------------------------------------------------------------------------

    def report(self, tools: Sequence[Mapping[str, Any]], parser: Any) -> TemplateReport:
        """What ``check_template`` found for these tools (checked now, once, when not yet)."""
        report = self._reports.get(self._tools_key(tools))
        if isinstance(report, TemplateError):
            raise report  # every episode offering these tools fails the same way, checked once
        if report is None:
            try:
                report = self.check_template((), tools, parser)
            except TemplateError as exc:
                self._reports[self._tools_key(tools)] = exc
                raise
        return report

    def check_template(
        self, prompt: Sequence[Message] = (), tools: Sequence[Mapping[str, Any]] = (), parser: Any = None
    ) -> TemplateReport:
        """Render a probe conversation (``prompt``, or a probe question, then the turn shapes a
        rollout produces, with tool calls and results only when ``tools`` are offered) whole and
        turn by turn. Raises ``TemplateError`` when the template fails on it or drops a probe
        message; reports whether turns can be appended (else: segments)."""
        report = template_check.check_template(self, prompt, tools, parser)
        self._reports[self._tools_key(tools)] = report
        return report

    def call_text(self, call: ToolCall) -> str:
        """How the family's models write ``call``: the template's own rendering of it where the
        template renders calls, else the parser's documented format."""
        if self.family.structured_calls:
            user = [{"role": "user", "content": _BASE_USER}]
            head = self._text(user, True)
            full = self._text([*user, self.chat(Message("assistant", "", tool_calls=(call,)))], False)
            if full.startswith(head) and full.endswith(self._closing_text):
                return full[len(head) : len(full) - len(self._closing_text)]
        return self.parser().write(call)

    def reasoning_text(self, thought: str) -> str:
        """A reasoning block as the family's models write it after the generation prompt ('' when
        the family has none; without the opening tag when the generation prompt opens it)."""
        think = self.family.reasoning
        if think is None and "</think>" in str(self.tokenizer.chat_template):
            think = ("<think>", "</think>")
        if think is None:
            return ""
        text = f"{think[0]}\n{thought}\n{think[1]}\n\n"
        if self.decode(self.generation_prompt).endswith(think[0] + "\n"):
            return text[len(think[0]) + 1 :]  # the template opens the block (DeepSeek-R1)
        return text
