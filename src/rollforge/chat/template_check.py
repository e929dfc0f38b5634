"""The start-up check of a chat template: can a rollout's turns be rendered by appending?

``check_template`` renders, per set of tools, a probe conversation of the shapes a rollout produces
(built from the model family: reasoning blocks where the family has them, tool calls in its format
and tool results only when the environment offers tools, probe text the template does not
rewrite). Every probe message must appear in the rendering (a template that drops tool results is
an error that says so), and the turn-by-turn ids must equal the whole rendering's. When they do not
-- the template rewrites history, e.g. drops past reasoning -- the ``TemplateReport`` says
``incremental=False`` and episodes continue in *segments* (``rollout/episode.py``).

The check only reads a ``ChatRenderer``'s public rendering methods; the renderer keeps the reports
(``ChatRenderer.report``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..errors import TemplateError
from ..types import Message, ToolCall
from .fidelity import first_difference
from .toolcalls import get_parser

if TYPE_CHECKING:
    from .render import ChatRenderer


@dataclass(frozen=True)
class TemplateReport:
    """What ``check_template`` found for one set of tools."""

    family: str
    parser: str
    #: Tools reach the prompt through the template's ``tools=`` (False: the fallback description).
    tools_in_template: bool
    #: Turns are rendered by appending (the template is prefix-preserving on the probe).
    incremental: bool
    #: Why episodes continue in segments (None when incremental).
    reason: str | None = None


def check_template(
    renderer: ChatRenderer, prompt: Sequence[Message], tools: Sequence[Mapping[str, Any]], parser: Any
) -> TemplateReport:
    """See ``ChatRenderer.check_template``."""
    family = renderer.family
    if parser is None:
        parser = get_parser(family.parser)
    opening = tuple(prompt) or (Message("user", "What is the probe answer?"),)
    opening, template_tools = renderer.with_tool_prompt(opening, tools, parser)
    turns = _probe_turns(renderer, bool(tools))
    conversation = [*opening, *turns]
    rendered = renderer.render_text(conversation, template_tools)
    missing = [m for m in turns if m.role != "assistant" and m.content not in rendered]
    if missing:
        roles = sorted({m.role for m in missing})
        raise TemplateError(
            f"the chat template of family {family.name!r} drops {'/'.join(roles)} messages: "
            f"{missing[0].content!r} never appears in the rendering, so the policy would never see "
            "them; use a template that renders them"
        )
    expected = renderer.conversation_ids(conversation, template_tools)
    reason = None
    try:
        got = _probe_incremental(renderer, opening, turns, template_tools)
        if got != expected and not _same_text_and_controls(renderer, expected, got):
            reason = (
                "the chat template rewrites earlier turns (rendering turn by turn gives different "
                f"ids than rendering the whole conversation: {_first_id_difference(renderer, expected, got)})"
            )
    except TemplateError as exc:
        reason = str(exc) if "prefix-preserving" in str(exc) else f"turns cannot be rendered one at a time: {exc}"
    return TemplateReport(family.name, family.parser, bool(template_tools), reason is None, reason)


def _probe_turns(renderer: ChatRenderer, with_tools: bool) -> list[Message]:
    reasoning = renderer.reasoning_text("probe reasoning")
    turns: list[Message] = []
    if with_tools:
        call = ToolCall("probe_tool", {"x": 1}, renderer.family.call_id(0, 0, 0))
        turns += [
            Message("assistant", reasoning + renderer.call_text(call), tool_calls=(call,)),
            Message("tool", "probe result 17", name="probe_tool", tool_call_id=call.id),
        ]
    turns += [
        Message("assistant", reasoning + "The answer is 42."),
        Message("user", "Too low, try again."),
        Message("assistant", reasoning + "43"),
    ]
    return turns


def _probe_incremental(renderer: ChatRenderer, opening, turns, tools) -> list[int]:
    ids = renderer.prompt_ids(opening, tools)
    for i, message in enumerate(turns):
        if message.role == "assistant":
            previous = turns[i - 1].role if i else "user"
            if previous != "assistant":
                ids += renderer.generation_prompt
            generated = renderer.encode(message.content) + list(renderer.stop_token_ids[:1])
            ids += generated + renderer.closing_ids(generated)
        else:
            ids += renderer.delta_ids([message], tools)
    return ids


def _same_text_and_controls(renderer: ChatRenderer, expected: Sequence[int], got: Sequence[int]) -> bool:
    """The same text and control tokens, split into other ordinary tokens: pieces encoded
    apart (the generation prompt before the model's first token) merge differently when the
    whole text is encoded at once, which is a tokenizer's boundary, not a rewritten turn
    (``token_fidelity_gap`` allows the same)."""
    controls = renderer.control_token_ids
    return renderer.decode(expected) == renderer.decode(got) and [t for t in expected if t in controls] == [
        t for t in got if t in controls
    ]


def _first_id_difference(renderer: ChatRenderer, expected: Sequence[int], got: Sequence[int]) -> str:
    whole, turns = renderer.decode(expected), renderer.decode(got)
    if whole != turns:
        return first_difference(whole, turns)
    i = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    return f"same text, different tokens from token {i}: {list(expected[i : i + 5])} vs {list(got[i : i + 5])}"
