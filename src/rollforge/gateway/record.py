"""What a gateway session recorded: its segments, each one sequence the model saw, and the trajectory they make.

A session's agents (``Session.agent``) each record their own segments; the session's record holds
the segments of the requests that named no agent, then each agent's, in the order the agents first
spoke (``combined``). Every segment is token-exact against the rendering of its own messages
with its own tools, which it keeps when they are not the first messages of the trajectory
(``Segment.history``) or not the tools of the last segment (``Segment.tools``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from ..rollout.ledger import lay_out
from ..types import Failure, Message, Segment, Trajectory

#: The limit that ended a session ("" while none has): ``truncated`` or ``max_turns_reached``, the
#: trajectory's ending of that name (``endings.py``), or ``timeout`` (an ``episode_timeout`` error).
SessionLimit = Literal["", "truncated", "max_turns_reached", "timeout"]


@dataclass(frozen=True)
class RecordedSegment:
    """One sequence the model saw: ``messages`` rendered with ``tools`` (template form: raw
    generated text, the fallback tool prompt merged into the system message) give ``token_ids``."""

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...]
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    prompt_length: int
    #: The agent whose conversation it is ("" for requests that name none).
    agent: str = ""


@dataclass(frozen=True)
class SessionRecord:
    """What a session recorded. ``ending``: ``truncated`` or ``max_turns_reached`` when a limit
    refused a request, ``timeout`` when its wall time ran out, else empty."""

    session_id: str
    segments: tuple[RecordedSegment, ...]
    turns: int
    failures: tuple[Failure, ...]
    ending: SessionLimit
    generation_seconds: float

    def trajectory(
        self,
        index: int,
        task_name: str,
        reward: float | None,
        error: Failure | None = None,
        metadata: Any = None,
        environment_seconds: float = 0.0,
    ) -> Trajectory:
        """The session as a trajectory: the segments' ids laid end to end, one turn per reply,
        ``reward`` (None: 0.0, for reward functions to score) on the last turn. A limit that
        refused a request ends it as truncated / max-turns-reached even when the client then failed."""
        if error is None and self.turns == 0:
            error = Failure("env_error", "the agent made no chat-completion request to the gateway")
        if self.ending == "timeout" and error is None:
            error = Failure("episode_timeout", "the session's time limit refused a request")
        limited = self.ending in ("truncated", "max_turns_reached")
        if limited:
            error = None
        ending = self.ending if limited else "error" if error is not None else "terminated"
        rewards = [0.0] * self.turns
        if rewards:
            rewards[-1] = float(reward or 0.0)
        last = self.segments[-1] if self.segments else RecordedSegment((), (), (), (), (), 0)
        parts = [  # a segment keeps the tools it was shown when they are not the last's (another agent's)
            (
                Segment(s.token_ids, s.loss_mask, s.logprobs, s.prompt_length, len(s.messages), tools=_own(s, last)),
                s.messages,
            )
            for s in self.segments
        ]
        return Trajectory(
            index=index,
            task_name=task_name,
            messages=last.messages,
            **lay_out(parts, last.messages),
            rewards=tuple(rewards),
            total_reward=float(sum(rewards)),
            turns=self.turns,
            ending=ending,  # type: ignore[arg-type]
            error=error,
            failures=self.failures,
            metadata=metadata,
            tools=last.tools,
            generation_seconds=self.generation_seconds,
            environment_seconds=environment_seconds,
        )


def _own(segment: RecordedSegment, last: RecordedSegment) -> tuple[Mapping[str, Any], ...] | None:
    """The tools ``segment`` was shown, when they are not ``last``'s (the trajectory's); else None."""
    return segment.tools if segment.tools != last.tools else None


def combined(session_id: str, records: Sequence[SessionRecord]) -> SessionRecord:
    """The records of one session's agents as one: segments in order, turns, failures and
    generation time summed, the first ending a limit set."""
    return SessionRecord(
        session_id,
        tuple(s for r in records for s in r.segments),
        sum(r.turns for r in records),
        tuple(f for r in records for f in r.failures),
        next((r.ending for r in records if r.ending), ""),
        sum(r.generation_seconds for r in records),
    )
