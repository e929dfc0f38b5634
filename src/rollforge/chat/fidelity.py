"""Is a trajectory token-exact? Each segment against the template's rendering, by ids.

``token_fidelity_gap`` is the check the tests and benchmarks run on every trajectory: each segment
is compared with ``ChatRenderer.conversation_ids`` of the messages it covers, rendered with the
tools it was shown (``Segment.tools``: two agents of one session offer different tools; else the
trajectory's), so forged control tokens (text that became a control token) are caught, which
comparing decoded text cannot do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..types import Segment, Trajectory

if TYPE_CHECKING:
    from .render import ChatRenderer


def token_fidelity_gap(trajectory: Trajectory, renderer: ChatRenderer) -> str | None:
    """Why a segment of ``trajectory`` does not hold the ids the template renders for its messages,
    or None when every segment does.

    Each segment is compared with ``conversation_ids`` of the messages it covers. A segment that
    ends on a generation (the next rendering rewrote it, as templates that drop reasoning do)
    is compared up to that generation -- the rendering of the messages before it with the
    generation prompt -- and the generation must decode to the assistant message. Ids must match
    exactly, with one allowance: the policy may have tokenized its own text differently from the
    tokenizer; then the decoded texts must be equal and hold the same control tokens, so no text
    became a control token. Documented endings that are allowed:

    - the episode ended on the policy's own tokens, so the template's closing text after the last
      assistant message (``\n`` after ``<|im_end|>``, or all of it after a cut generation) is absent;
    - the episode stopped after a generation prompt (an error or no room left to generate);
    - a truncated or failed episode is a prefix of its rendering (the last observation was cut).
    """
    for number, segment in enumerate(trajectory.segments):
        last = number == len(trajectory.segments) - 1
        cut = last and bool(trajectory.truncated or trajectory.error)
        gap = _segment_gap(segment, trajectory, renderer, cut)
        if gap is not None:
            return f"segment {number}: {gap}" if len(trajectory.segments) > 1 else gap
    return None


def _segment_gap(segment: Segment, trajectory: Trajectory, renderer: ChatRenderer, cut_allowed: bool) -> str | None:
    ids, messages = list(segment.token_ids), segment.history or trajectory.messages[: segment.messages]
    tools = segment.tools if segment.tools is not None else trajectory.tools
    if (
        not ids and not messages
    ):  # an episode that failed before anything was rendered (an agent's first request refused)
        return None
    gap = _ids_gap(ids, renderer.conversation_ids(messages, tools), renderer, cut_allowed, closing=True)
    if gap is None or _ids_gap(ids, renderer.conversation_ids(messages, tools, True), renderer, cut_allowed) is None:
        return None
    mask = segment.loss_mask
    if messages and messages[-1].role == "assistant" and mask and mask[-1] == 1:
        start = len(mask) - next(i for i, bit in enumerate(reversed(mask)) if bit == 0) if 0 in mask else 0
        head = renderer.conversation_ids(messages[:-1], tools, add_generation_prompt=True)
        if _ids_gap(ids[:start], head, renderer, False) is not None and ids[: len(head)] == head:
            start = len(head)  # the generation opened with forced tokens (mask 0: the gateway's tool_choice)
        if _ids_gap(ids[:start], head, renderer, False) is None:
            if renderer.decode(renderer.content_ids(ids[start:])) == messages[-1].content:
                return None
            return "the last generation does not decode to the last assistant message"
    return gap


def _ids_gap(
    ids: list[int], expected: list[int], renderer: ChatRenderer, cut_allowed: bool, closing: bool = False
) -> str | None:
    if ids == expected:
        return None
    if expected[: len(ids)] == ids and (
        cut_allowed or (closing and _is_closing_tail(expected[len(ids) :], renderer.closing))
    ):
        return None
    # The policy may have written its text in other tokens than the tokenizer would: same text and
    # same control tokens is still exact about everything the template and environment added.
    decoded, text = renderer.decode(ids), renderer.decode(expected)
    same_text = decoded == text or (
        closing and text.startswith(decoded) and renderer._closing_text.endswith(text[len(decoded) :])
    )
    if cut_allowed and not same_text:
        same_text = text.startswith(decoded.rstrip("\ufffd"))
    if not same_text:
        return first_difference(text, decoded)
    controls = renderer.control_token_ids
    ours = [t for t in ids if t in controls]
    theirs = [t for t in expected if t in controls][: len(ours)]
    if ours != theirs:
        return (
            f"control tokens differ: the ids hold {renderer.decode(ours)!r}, the rendering {renderer.decode(theirs)!r}"
        )
    return None


def _is_closing_tail(rest: Sequence[int], closing: Sequence[int]) -> bool:
    return len(rest) <= len(closing) and list(closing[len(closing) - len(rest) :]) == list(rest)


def first_difference(expected: str, got: str, left: str = "whole conversation", right: str = "turn by turn") -> str:
    i = next((k for k, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    return f"at character {i}: {left} gives {expected[max(0, i - 20) : i + 20]!r}, {right} gives {got[max(0, i - 20) : i + 20]!r}"
