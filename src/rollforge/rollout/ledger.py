"""THE token ledger: the ids one episode or gateway session put before the model, kept once.

Both the episode loop (``rollout/episode.py``) and the gateway (``gateway/session.py``) record
through it::

    ids   = prompt | gen-prompt | generated (policy) | closing + observation | gen-prompt | ...
    mask  =   0    |     0      |         1          |           0           |     0      | ...

Generated ids are kept exactly as the backend returned them, with their logprobs (and weight
versions, when the backend says). A **segment** is one sequence the model saw: the messages it was
shown, rendered, then the text it generated and what was appended after it. When the conversation
can no longer be extended by appending -- a chat template that rewrites history, or an agent that
sends back its own rewrite of a reply (smolagents' "Calling tools: [...]" text) -- the current
segment is closed with the messages it renders and the next one starts whose prompt is the
rendering of the conversation as it now is. A closed segment whose messages are not the first
messages of the finished conversation keeps them (``Segment.history``), and one rendered with
other tools than the last keeps those (``Segment.tools``), so every segment stays token-exact
against its own rendering (``token_fidelity_gap``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from ..types import Message, Segment


@dataclass
class Ledger:
    """The current segment's ids, mask, logprobs and the segments closed before it."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    #: Weight version of each policy token, when the backend says.
    versions: list[int] = field(default_factory=list)
    prompt_length: int = 0
    #: Closed segments with the messages each renders.
    closed: list[tuple[Segment, tuple[Message, ...]]] = field(default_factory=list)

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None = None, version: int | None = None) -> None:
        """Append ``ids``: the policy's (mask 1) when they come with ``logprobs``, else mask 0."""
        self.ids += ids
        if logprobs is None:
            self.mask += [0] * len(ids)
            self.logprobs += [None] * len(ids)
            return
        self.mask += [1] * len(ids)
        self.logprobs += logprobs
        if version is not None:
            self.versions += [version] * len(ids)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start the (empty) current segment with its prompt (mask 0)."""
        self.extend(prompt_ids)
        self.prompt_length = len(self.ids)

    def cut_to(self, limit: int) -> None:
        del self.ids[limit:], self.mask[limit:], self.logprobs[limit:]
        self.prompt_length = min(self.prompt_length, limit)

    def segment(self, covers: int) -> Segment:
        """The current segment, rendering ``covers`` messages."""
        return Segment(tuple(self.ids), tuple(self.mask), tuple(self.logprobs), self.prompt_length, covers)

    def close(self, messages: Sequence[Message]) -> None:
        """Close the current segment (it renders ``messages``); the next starts empty."""
        self.closed.append((self.segment(len(messages)), tuple(messages)))
        self.ids, self.mask, self.logprobs, self.prompt_length = [], [], [], 0

    def fields(self, messages: Sequence[Message], covers: int | None = None) -> dict[str, Any]:
        """The ``Trajectory`` token fields of a conversation that ended as ``messages``, the
        current segment rendering the first ``covers`` of them (all by default)."""
        if not self.closed and covers is None:
            policy = sum(self.mask)
            return {
                "token_ids": tuple(self.ids),
                "loss_mask": tuple(self.mask),
                "logprobs": tuple(self.logprobs),
                "prompt_length": self.prompt_length,
                "versions": _versions(self.versions, policy),
            }
        current = (self.segment(len(messages) if covers is None else covers), ())
        return lay_out([*self.closed, current], messages, self.versions)


def lay_out(
    parts: Sequence[tuple[Segment, tuple[Message, ...]]], messages: Sequence[Message], versions: Sequence[int] = ()
) -> dict[str, Any]:
    """The ``Trajectory`` token fields of segments laid end to end, each with the messages it
    renders (empty: the first ``Segment.messages`` of ``messages``); a segment whose messages are
    not the first of ``messages`` keeps them as its ``history``."""
    segments = tuple(
        s if not own or tuple(messages[: len(own)]) == own else replace(s, history=own) for s, own in parts
    )
    ids = tuple(t for s in segments for t in s.token_ids)
    mask = tuple(b for s in segments for b in s.loss_mask)
    return {
        "token_ids": ids,
        "loss_mask": mask,
        "logprobs": tuple(lp for s in segments for lp in s.logprobs),
        "prompt_length": segments[0].prompt_length if segments else 0,
        "segments": segments,
        "versions": _versions(versions, sum(mask)),
    }


def _versions(versions: Sequence[int], policy_tokens: int) -> tuple[int, ...]:
    """The versions when every policy token has one, else none."""
    return tuple(versions) if len(versions) == policy_tokens else ()
