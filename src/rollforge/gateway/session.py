"""One gateway session: chat-completions requests in, a token-exact trajectory recorded.

A session records the conversation its client is having in the token ledger the episode loop
uses (``rollout/ledger.py``)::

    ids  = prompt | gen-prompt | generated (mask 1) | closing + new messages | gen-prompt | ...

Each request is compared with the session's conversation so far (``WireMessage`` values, the form
the client sees). When it **extends** it -- the same messages, one of the replies the gateway sent,
then new messages (tool results, a user turn) -- only the new messages are rendered
(``closing_ids`` + ``delta_ids`` + ``generation_prompt``) and the reply's generated ids are kept
exactly. When the client **rewrote** its history (compaction, dropped reasoning, an edited
message, other tools) the current segment is closed and a new one starts whose prompt (mask 0) is
the template's rendering of the request; replies the gateway sent that reappear in it keep their
raw generated text. A reply the client sends back in its own words (smolagents' "Calling tools:
[...]" text) is such a rewrite: the segment before it keeps the messages the model was shown and
the text it generated (``Segment.history`` in the trajectory). A request identical to the
previous one after a failed generation is a retry.

With ``n > 1`` the conversation continues with whichever choice the client sends back (the first
one when it sends none back before the session ends). Requests of one session are served one at a
time. Limits (``SessionLimits``): a segment's length (a request that would reach it is refused and
the session is ``truncated``), tokens per reply, requests per session (``max_turns_reached``) and
wall time; a refused request is an HTTP 400 whose message names the limit.

``tool_choice`` ``required`` or a named function: the family's call opener is forced before the
generation (``forcing.py``) and recorded under mask 0, out of the loss. Several agents on one
session (a planner and an executor, each with its own history): ``agent(name)`` is the named
agent's own conversation, recorded in its own segments with the session's limits; the session's
record lays its own segments and then each agent's end to end (``record.py``).

Images (``Message.images`` of user and tool messages, from the client's ``image_url`` parts) are
rendered by the session's renderer like any message; every generation gets the segment's images so
far, in order (``generate(..., images=...)``). A request with images to a text-only backend
(``accepts_images`` False) is a 400 saying the policy does not accept images.

A generated completion becomes a reply, a reply a choice, and a request's wire messages template
messages in ``replies.py`` (no state); the session keeps the conversation and its tokens.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..backends.base import CURRENT_EPISODE, Backend, SamplingParams
from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser
from ..errors import TemplateError, WireError
from ..rollout.ledger import Ledger
from ..seeds import mix, sampling_seed
from ..types import Completion, Failure, Message
from .forcing import forced_opener
from .record import RecordedSegment, SessionLimit, SessionRecord, combined
from .replies import Reply, build_reply, reply_choice, template_messages
from .wire import ChatRequest, Choice, WireMessage


@dataclass(frozen=True)
class SessionLimits:
    """Bounds of one session."""

    max_seq_len: int = 4096
    """Tokens of one segment (prompt, replies and new messages); a request that reaches it is refused."""
    max_new_tokens: int = 1024
    """Tokens of one reply (a request's own ``max_tokens`` may only lower it)."""
    max_requests: int = 64
    """Chat-completion requests a session accepts (a retry counts)."""
    timeout: float | None = None
    """Seconds from the session's first request after which requests are refused; None: no limit."""


@dataclass(frozen=True)
class Sampling:
    """How replies are sampled. ``fixed``: the request's temperature and top_p are ignored (in
    training the rollout config decides the behaviour policy). Seeds: the request's ``seed`` (plus
    the choice index) unless fixed, else derived from ``seed``, the session and the turn."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    fixed: bool = False

    def params(
        self, request: ChatRequest, budget: int, stop_ids: tuple[int, ...], session_seed: int, turn: int, k: int
    ) -> SamplingParams:
        temperature = self.temperature if self.fixed or request.temperature is None else request.temperature
        top_p = self.top_p if self.fixed or request.top_p is None else request.top_p
        if request.seed is not None and not self.fixed:
            seed = request.seed + k
        elif self.seed is not None:
            seed = sampling_seed(self.seed, session_seed, turn, k)
        else:
            seed = None
        return SamplingParams(budget, temperature, top_p, self.top_k, request.stop, stop_ids, seed)


class Session:
    """Records one client's conversation; ``complete`` answers one request (see the module docstring)."""

    def __init__(
        self,
        session_id: str,
        renderer: ChatRenderer,
        parser: ToolCallParser,
        limits: SessionLimits = SessionLimits(),
        sampling: Sampling = Sampling(),
        seed: int = 0,
        agent: str = "",
    ):
        self.session_id, self.agent_name = session_id, agent
        #: The session's agents by name, each with its own conversation (``agent``).
        self.agents: dict[str, Session] = {}
        self._openers: dict[str | None, list[int]] = {}  # forced tool-call openers by tool (None: any)
        self.renderer, self.parser, self.limits, self.sampling, self.seed = renderer, parser, limits, sampling, seed
        self._lock = asyncio.Lock()
        self._segments: list[RecordedSegment] = []
        self._failures: list[Failure] = []
        self._ending: SessionLimit = ""
        self._started: float | None = None
        self._requests = 0
        self._turns = 0
        self._generation_seconds = 0.0
        self._ours: dict[WireMessage, Message] = {}  # every reply sent, to recognise it in a rewritten history
        #: The raw and parsed messages of the last request (``parse_request`` skips what repeats).
        self.known: tuple[Sequence[Any], Sequence[WireMessage]] = ((), ())
        self._reset_segment()

    def _reset_segment(self) -> None:
        self._wire: list[WireMessage] = []  # the conversation as the client sees it
        self._messages: list[Message] = []  # the same, as the template renders it
        self._tools: tuple[Mapping[str, Any], ...] = ()
        self._tools_key: str | None = None
        self._tokens = Ledger()  # the current segment's ids
        self._pending: list[Reply] = []
        self._last_generated: list[int] = []
        self._incremental = True

    # -- serving -------------------------------------------------------------------------------

    async def complete(self, request: ChatRequest, backend: Backend) -> tuple[list[Choice], int]:
        """Generate the request's choices; returns them and the prompt's length in tokens."""
        CURRENT_EPISODE.set(self)  # this request's own task: a router keeps the session on one replica
        async with self._lock:
            check_images(request, backend)
            forced = self._forced(request)
            try:
                budget = self._prepare(request, len(forced))
            except TemplateError as exc:
                self._failures.append(Failure("template_error", str(exc)))
                raise WireError(
                    f"the chat template cannot render this conversation: {exc}", code="template_error"
                ) from None
            turn = self._requests
            self._requests += 1
            prompt = self._tokens.ids + forced
            params = [
                self.sampling.params(request, budget, self.renderer.stop_token_ids, self.seed, turn, k)
                for k in range(request.n)
            ]
            images = tuple(image for message in self._messages for image in message.images)
            shown = {"images": images} if images else {}  # the conversation's images so far, in order
            started = time.perf_counter()
            results = await asyncio.gather(
                *(backend.generate(prompt, p, **shown) for p in params), return_exceptions=True
            )
            self._generation_seconds += time.perf_counter() - started
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None:
                if not isinstance(failed, Exception):
                    raise failed
                self._failures.append(Failure("backend_error", f"{type(failed).__name__}: {failed}"))
                raise WireError(
                    f"generation failed: {type(failed).__name__}: {failed}", status=502, code="backend_error"
                )
            self._pending = [self._reply(request, forced, c, turn, k) for k, c in enumerate(results)]
            choices = [reply_choice(self.renderer, request, r, c) for r, c in zip(self._pending, results)]
            return choices, len(prompt) - len(forced)

    def agent(self, name: str) -> "Session":
        """The conversation of agent ``name`` in this session: its own history and segments, in
        this session's record after the segments of the requests that name no agent."""
        child = self.agents.get(name)
        if child is None:
            child = self.agents[name] = Session(
                f"{self.session_id}/agents/{name}",
                self.renderer,
                self.parser,
                self.limits,
                self.sampling,
                mix(self.seed, len(self.agents) + 1),
                name,
            )
        return child

    def record(self) -> SessionRecord:
        """The session so far (the last reply continued with its first choice), its agents' segments after its own."""
        own = self._own_record()
        return combined(self.session_id, [own, *(a.record() for a in self.agents.values())]) if self.agents else own

    def _own_record(self) -> SessionRecord:
        segments = list(self._segments)
        if self._pending or self._tokens.ids:
            pending, current = self._pending[:1], self._current_segment()
            if pending:  # without mutating: a record may be taken while the session goes on
                reply, forced = pending[0], len(pending[0].forced)
                current = RecordedSegment(
                    (*current.messages, reply.message),
                    current.tools,
                    current.token_ids + tuple(reply.forced + reply.ids),
                    current.loss_mask + (0,) * forced + (1,) * len(reply.ids),
                    current.logprobs + (None,) * forced + reply.logprobs,
                    current.prompt_length,
                    self.agent_name,
                )
            if 1 in current.loss_mask:
                segments.append(current)
        turns = self._turns + (1 if self._pending else 0)
        return SessionRecord(
            self.session_id, tuple(segments), turns, tuple(self._failures), self._ending, self._generation_seconds
        )

    # -- the conversation ------------------------------------------------------------------------

    def _forced(self, request: ChatRequest) -> list[int]:
        """The ids forced before the reply (``forcing.py``): a call opener when ``tool_choice`` asks for a call."""
        if request.tool_choice not in ("required", "function"):
            return []
        opener = self._openers.get(request.tool_name)
        if opener is None:
            opener = self._openers[request.tool_name] = forced_opener(self.renderer, self.parser, request.tool_name)
        return opener

    def _prepare(self, request: ChatRequest, forced: int) -> int:
        """Make the ledger's ids the prompt of ``request`` (``forced`` ids follow it); return the reply's token budget."""
        self._check_limits()
        messages = list(request.messages)
        if not self._continues(messages, request.tools_key):
            self._close_segment(messages)
            self._start_segment(request)
        budget = min(
            request.max_tokens or self.limits.max_new_tokens,
            self.limits.max_new_tokens,
            self.limits.max_seq_len - len(self._tokens.ids) - forced,
        )
        if budget <= 0:
            self._ending = "truncated"
            raise self._limit(
                f"the session's conversation has {len(self._tokens.ids)} tokens; its limit is max_seq_len={self.limits.max_seq_len}"
            )
        return budget

    def _continues(self, messages: list[WireMessage], tools_key: str) -> bool:
        """Whether ``messages`` extend the current segment (then appended to it): its conversation,
        one of the replies sent, new messages. A request equal to the conversation after a failed
        generation is a retry. False when the client or the template rewrote history."""
        n = len(self._wire)
        if not self._wire or tools_key != self._tools_key or messages[:n] != self._wire:
            return False
        if not self._pending:
            return len(messages) == n
        reply = next((r for r in self._pending if len(messages) > n + 1 and r.wire == messages[n]), None)
        if reply is None:
            return False
        self._adopt(reply)
        return self._extend(messages[n + 1 :])

    def _check_limits(self) -> None:
        now = time.monotonic()
        if self._started is None:
            self._started = now
        if self._ending:
            raise self._limit(f"the session already ended ({self._ending}); start a new session")
        if self._requests >= self.limits.max_requests:
            self._ending = "max_turns_reached"
            raise self._limit(f"the session answered its limit of max_requests={self.limits.max_requests} requests")
        if self.limits.timeout is not None and now - self._started > self.limits.timeout:
            self._ending = "timeout"
            raise self._limit(f"the session exceeded its time limit of {self.limits.timeout}s")

    def _limit(self, message: str) -> WireError:
        return WireError(
            f"session {self.session_id!r}: {message}",
            code="context_length_exceeded" if self._ending == "truncated" else "session_limit",
        )

    def _adopt(self, reply: Reply) -> None:
        """The client continued with ``reply``: its forced (mask 0) and generated ids join the conversation."""
        self._tokens.extend(reply.forced)
        self._tokens.extend(reply.ids, reply.logprobs)
        self._messages.append(reply.message)
        self._wire.append(reply.wire)
        self._pending = []
        self._turns += 1
        self._last_generated = reply.forced + reply.ids

    def _extend(self, new: Sequence[WireMessage]) -> bool:
        """Append ``new`` after the adopted reply. With a prefix-preserving template only they are
        rendered; with one that rewrites history (``report(...).incremental`` is False) the whole
        conversation is, and appended when the ids so far are its prefix; False when they are not
        (a new segment starts)."""
        renderer, ids = self.renderer, self._tokens.ids
        messages = self._template_messages(new, self._wire)
        if self._incremental:
            observation = renderer.closing_ids(self._last_generated) + renderer.delta_ids(messages, self._tools)
            observation += renderer.generation_prompt
        else:
            whole = renderer.conversation_ids([*self._messages, *messages], self._tools, add_generation_prompt=True)
            if whole[: len(ids)] != ids:
                return False
            observation = whole[len(ids) :]
        if len(ids) + len(observation) >= self.limits.max_seq_len:
            self._ending = "truncated"
            raise self._limit(
                f"the new messages ({len(observation)} tokens) do not fit in max_seq_len={self.limits.max_seq_len} "
                f"after the {len(ids)} tokens so far"
            )
        self._tokens.extend(observation)
        self._messages += messages
        self._wire += new
        return True

    def _start_segment(self, request: ChatRequest) -> None:
        """A new segment whose prompt (mask 0) is the template's rendering of the request."""
        messages = self._template_messages(request.messages, ())
        prompt, tools = self.renderer.with_tool_prompt(messages, request.tools, self.parser)
        incremental = self.renderer.report(request.tools, self.parser).incremental
        self._reset_segment()
        self._incremental = incremental
        self._wire, self._messages, self._tools, self._tools_key = (
            list(request.messages),
            list(prompt),
            tools,
            request.tools_key,
        )
        self._tokens.begin(self.renderer.conversation_ids(prompt, tools, add_generation_prompt=True))

    def _close_segment(self, next_messages: Sequence[WireMessage]) -> None:
        """End the current segment before a rewritten history, with the reply the client kept (or
        the first) as its last turn; a segment without generated tokens is dropped."""
        if self._pending:
            kept = set(next_messages)
            self._adopt(next((r for r in self._pending if r.wire in kept), self._pending[0]))
        if 1 in self._tokens.mask:
            self._segments.append(self._current_segment())

    def _current_segment(self) -> RecordedSegment:
        t = self._tokens
        return RecordedSegment(
            tuple(self._messages),
            self._tools,
            tuple(t.ids),
            tuple(t.mask),
            tuple(t.logprobs),
            t.prompt_length,
            self.agent_name,
        )

    # -- replies ---------------------------------------------------------------------------------

    def _reply(self, request: ChatRequest, forced: list[int], completion: Completion, turn: int, k: int) -> Reply:
        """Choice ``k`` of request ``turn`` as a reply (``replies.build_reply``), remembered so that it
        keeps its raw text when the client sends it back in a rewritten history."""
        reply, failures = build_reply(self.renderer, self.parser, request, forced, completion, (self.seed, turn, k))
        self._failures += failures
        self._ours[reply.wire] = reply.message
        return reply

    def _template_messages(self, wire: Sequence[WireMessage], before: Sequence[WireMessage]) -> list[Message]:
        return template_messages(wire, before, self._ours)


def check_images(request: ChatRequest, backend: Backend) -> None:
    """A request with images needs a backend that takes them (``Backend.accepts_images``): else a 400."""
    at = [k for k, m in enumerate(request.messages) if m.images]
    if at and not backend.accepts_images:
        count = sum(len(request.messages[k].images) for k in at)
        raise WireError(
            f"messages[{at[0]}] holds an image ({count} in the request) but the policy does not accept images: "
            f"its backend {type(backend).__name__} is text-only (accepts_images=False); send text, or serve "
            "a vision-language model",
            f"messages[{at[0]}].content",
            code="images_not_accepted",
        )
