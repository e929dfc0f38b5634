"""What one episode runs with and what it has produced so far: the turn loop's two values.

``EpisodeContext`` is shared by every episode of a rollout: the backend, the chat renderer, the
tool-call parser and the rollout config, with the two pieces of work it moves off the event loop
(tokenizing long observations, parsing long replies; same results either way). ``EpisodeState`` is
one episode's own: its messages, its token ledger, rewards, failures and timings, kept whole when
the episode is cancelled or fails, so that nothing it produced is lost; ``trajectory`` turns it into
the ``Trajectory``, with where its session and its generation were served (``placement.py``).
``Gate`` is where a scheduler may hold an episode (lockstep barriers); ``OpenGate`` never holds
anyone. The turn loop itself is ``episode.py``; the calls it makes across boundaries are
``calls.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser
from ..envs.base import BaseSession
from ..placement import Placement, ServedBy
from ..types import Ending, Failure, Message, Sample, ToolCall, Trajectory
from ..workers import RENDER_WORKERS, run_blocking
from .config import RolloutConfig
from .ledger import Ledger


class Gate(Protocol):
    """Where the scheduler may hold an episode: before each generation and each environment step.
    ``leave`` is called once when the episode ends."""

    async def wait(self, phase: str) -> None: ...

    def leave(self) -> None: ...


class OpenGate:
    """Async per-sample scheduling: never holds anyone."""

    async def wait(self, phase: str) -> None:
        return None

    def leave(self) -> None:
        return None


#: Replies longer than this (characters) are parsed for tool calls on a worker thread.
PARSE_INLINE_CHARS = 4096
#: Observations longer than this (characters) are tokenized on the render thread: the Rust
#: tokenizer releases the GIL, so the encode runs beside the event loop instead of on it.
RENDER_INLINE_CHARS = 256


@dataclass
class EpisodeContext:
    backend: Backend
    renderer: ChatRenderer
    parser: ToolCallParser
    config: RolloutConfig
    #: The backend takes ``generate(..., images=...)`` (``Backend.accepts_images``).
    accepts_images: bool = field(init=False)
    #: Token ids at or above this are outside the tokenizer's vocabulary.
    vocab_size: int = field(init=False)
    _render_slot: asyncio.Semaphore | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.accepts_images = self.backend.accepts_images
        self.vocab_size = len(self.renderer.tokenizer)

    async def delta_ids(self, messages: Sequence[Message], tools: Sequence[Any]) -> list[int]:
        """``renderer.delta_ids``: short observations inline, longer ones on the render thread
        (one at a time: the other core stays with the event loop). Same ids either way."""
        if sum(len(m.content) for m in messages) <= RENDER_INLINE_CHARS:
            return self.renderer.delta_ids(messages, tools)
        if self._render_slot is None:
            self._render_slot = asyncio.Semaphore(1)
        async with self._render_slot:
            return await RENDER_WORKERS.run(self.renderer.delta_ids, messages, tools)

    async def parse(self, text: str) -> tuple[ToolCall, ...]:
        """The tool calls of a reply; long replies are parsed on a worker thread so that no
        reply, however pathological, holds the event loop."""
        if len(text) <= PARSE_INLINE_CHARS:
            return self.parser.parse(text)
        return await run_blocking(self.parser.parse, text)


@dataclass
class EpisodeState:
    """What the episode has produced so far; survives cancellation so nothing is lost."""

    index: int
    sample: Sample
    messages: list[Message] = field(default_factory=list)
    tokens: Ledger = field(default_factory=Ledger)
    prompt_messages: int | None = None
    rewards: list[float] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    tools: tuple = ()  # the tool schemas the template renders
    ending: Ending | None = None  # None while the episode runs
    error: Failure | None = None
    generation_seconds: float = 0.0
    environment_seconds: float = 0.0
    #: How many messages the last segment renders, when the episode ended with messages after it.
    last_covers: int | None = None
    #: The Ray replica that returned the episode's last completion (``Completion.served_by``).
    generated_on: Placement | None = None

    def fail(self, failure: Failure) -> None:
        """End the episode with ``failure`` (the ``error`` ending)."""
        self.error, self.ending = failure, "error"

    def trajectory(self, session: Any) -> Trajectory:
        return Trajectory(
            index=self.index,
            task_name=self.sample.task_name,
            messages=tuple(self.messages),
            **self.tokens.fields(self.messages, self.last_covers),
            prompt_messages=self.prompt_messages,
            rewards=tuple(self.rewards),
            total_reward=float(sum(self.rewards)),
            turns=len(self.rewards),
            ending=self.ending,  # type: ignore[arg-type]  # set once the episode ended
            error=self.error,
            failures=tuple(self.failures),
            metadata=session.metadata if session is not None else None,
            tools=self.tools,
            generation_seconds=self.generation_seconds,
            environment_seconds=self.environment_seconds,
            environment=session.handle if session is not None else None,
            served_by=self.served_by(session),
        )

    def served_by(self, session: Any) -> ServedBy:
        """Where the episode was served: its session's actor (a session that does not subclass
        ``BaseSession`` runs here) and the replica of its last completion."""
        actor = session.placement if isinstance(session, BaseSession) else None
        return ServedBy(actor, self.generated_on)
