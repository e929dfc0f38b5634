"""The OpenAI-compatible HTTP server: ``/v1/chat/completions``, ``/v1/responses`` and ``/v1/models`` over sessions.

``Gateway`` is an async context manager that serves, on ``host`` (127.0.0.1 unless asked) and
``port`` (0: a free one), the routes::

    POST /v1/chat/completions                  session from the X-Rollforge-Session or X-Session-ID header
    POST /sessions/<id>/v1/chat/completions    session from the path: point any client's base URL at it
    POST /sessions/<id>/agents/<agent>/v1/...  one agent of the session (every POST route above and below)
    POST /v1/responses, /sessions/<id>/v1/responses   the Responses API, recorded as chat completions
    POST /v1/messages, /sessions/<id>/v1/messages   Anthropic Messages, translated onto chat
                                               completions (``messages.py``): the same recording
    GET  /v1/models, /sessions/<id>/v1/models, /sessions/<id>/agents/<agent>/v1/models
    GET  /sessions/<id>/trajectory             the session recorded so far, as trajectory JSON (with
                                               each segment's own messages after a rewrite)

The session id is the path's, else the ``X-Rollforge-Session`` header's, else ``X-Session-ID``'s
(the header verifiers sends per agent trace). A request without a session id belongs to the
session ``default``. Sessions are created on their first request, or only by ``open_session`` when
``open_sessions=False`` (the agent environment: a request for an unknown or closed session is a
404, so an agent that outlives its episode cannot write into another one). ``close_session``
returns the session's ``SessionRecord``. Bad requests are answered in OpenAI's error shape (the
SDKs raise ``BadRequestError`` with the message).

Several agents on one episode (a planner and an executor, each sending its own history) name
themselves by the path (``/sessions/<id>/agents/<agent>/v1``: the agent's base URL) or by the
``X-Agent-ID`` header on the session's URL. Each agent's conversation is recorded in its own
segments, token-exact, and the session's record (``close_session``, the trajectory) holds the
segments of requests that named no agent, then each agent's (``segment_agents`` in the trajectory
JSON says whose each is). Without agent ids, two agents interleaving on one session would look
like rewritten histories: one segment per request.

Rendering and recording live in ``session.py``, the wire format in ``wire.py`` (and the Responses
API's translation onto it in ``responses.py``); this module only routes. It uses aiohttp (the ``gateway`` extra).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser
from ..errors import ConfigError, WireError, require
from ..types import Trajectory
from .responses import ResponseStore, chat_body, output_items, response_body, stream_events
from . import messages as anthropic
from .record import SessionRecord
from .session import Sampling, Session, SessionLimits
from .wire import ChatRequest, Choice, completion_body, models_body, parse_request, stream_chunks

SESSION_HEADER = "X-Rollforge-Session"
#: The header that names the agent of a session a request comes from (``Session.agent``).
AGENT_HEADER = "X-Agent-ID"
#: The session header of other harnesses (verifiers sends one per agent trace).
TRACE_HEADER = "X-Session-ID"
DEFAULT_SESSION = "default"
_MAX_BODY = 64 * 1024 * 1024


@dataclass(frozen=True)
class Address:
    """Where a gateway listens: ``host`` (127.0.0.1 unless asked) and ``port`` (0: a free one)."""

    host: str = "127.0.0.1"
    port: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535 (0: a free port), got {self.port}")


class Gateway:
    """Serves chat completions for ``model_name`` from ``backend``, rendered with ``renderer``."""

    def __init__(
        self,
        backend: Backend,
        renderer: ChatRenderer,
        parser: ToolCallParser,
        *,
        model_name: str = "rollforge",
        limits: SessionLimits = SessionLimits(),
        sampling: Sampling = Sampling(),
        address: Address = Address(),
        open_sessions: bool = True,
    ):
        self.backend, self.renderer, self.parser = backend, renderer, parser
        self.model_name, self.limits, self.sampling = model_name, limits, sampling
        self.host, self.port, self.open_sessions = address.host, address.port, open_sessions
        self.sessions: dict[str, Session] = {}
        self._responses: dict[str, ResponseStore] = {}  # per session, for previous_response_id
        self._created = int(time.time())
        self._runner: Any = None
        self._next_seed = 0

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> "Gateway":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def start(self) -> None:
        web = require("aiohttp.web", "gateway", "the OpenAI-compatible gateway")
        app = web.Application(client_max_size=_MAX_BODY)
        for root in ("", "/sessions/{session}", "/sessions/{session}/agents/{agent}"):
            for route, handler in (
                ("chat/completions", self._chat),
                ("responses", self._responses_route),
                ("messages", self._messages),
            ):
                app.router.add_post(f"{root}/v1/{route}", handler)
            app.router.add_get(f"{root}/v1/models", self._models)
        app.router.add_get("/sessions/{session}/trajectory", self._trajectory)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def base_url(self, session_id: str | None = None, agent: str | None = None) -> str:
        """The base URL a client uses (``OPENAI_BASE_URL``), for one session (and one of its agents) or the header form."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        root = f"http://{host}:{self.port}"
        if not session_id:
            return f"{root}/v1"
        return f"{root}/sessions/{session_id}/agents/{agent}/v1" if agent else f"{root}/sessions/{session_id}/v1"

    # -- sessions --------------------------------------------------------------------------------

    def open_session(
        self, session_id: str | None = None, *, limits: SessionLimits | None = None, seed: int | None = None
    ) -> Session:
        session_id = session_id or uuid.uuid4().hex
        if session_id in self.sessions:
            raise ConfigError(f"session {session_id!r} is already open")
        if seed is None:
            seed, self._next_seed = self._next_seed, self._next_seed + 1
        session = Session(session_id, self.renderer, self.parser, limits or self.limits, self.sampling, seed)
        self.sessions[session_id] = session
        return session

    def close_session(self, session_id: str) -> SessionRecord:
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise ConfigError(f"no open session {session_id!r}")
        for served in (session, *session.agents.values()):
            self._responses.pop(served.session_id, None)
        return session.record()

    def trajectory(self, session_id: str) -> Trajectory:
        """An open session's recording so far as a trajectory (task ``gateway``, no reward)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise ConfigError(f"no open session {session_id!r}")
        return session.record().trajectory(0, "gateway", None, metadata={"session": session_id})

    def trajectory_json(self, session_id: str) -> dict[str, Any]:
        """The trajectory's JSON record, with each segment's own messages and tools when the client
        rewrote its history (``messages`` are the last segment's)."""
        record = self.trajectory(session_id).to_json()
        segments = self.sessions[session_id].record().segments
        if len(segments) > 1:
            record["segment_messages"] = [[m.to_json() for m in s.messages] for s in segments]
            record["segment_tools"] = [list(s.tools) for s in segments]
        if any(s.agent for s in segments):
            record["segment_agents"] = [s.agent for s in segments]
        return {"session": session_id, **record}

    def _session(self, request: Any) -> Session:
        headers = request.headers
        session_id = (
            request.match_info.get("session")
            or headers.get(SESSION_HEADER)
            or headers.get(TRACE_HEADER)
            or DEFAULT_SESSION
        )
        session = self.sessions.get(session_id)
        if session is None:
            if not self.open_sessions:
                raise WireError(f"no open session {session_id!r}", status=404, code="session_not_found")
            session = self.open_session(session_id)
        agent = request.match_info.get("agent") or headers.get(AGENT_HEADER)
        return session.agent(agent) if agent else session

    # -- routes ----------------------------------------------------------------------------------

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(models_body(self.model_name, self._created))

    async def _trajectory(self, request: Any) -> Any:
        from aiohttp import web

        session_id = request.match_info["session"]
        if session_id not in self.sessions:
            return web.json_response(WireError(f"no open session {session_id!r}", status=404).body(), status=404)
        return web.json_response(self.trajectory_json(session_id))

    async def _complete(self, request: Any, to_chat: Any) -> _Served:
        """Read the body, find the session, translate with ``to_chat(body, session)`` and generate."""
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WireError(f"the request body is not valid JSON: {exc}") from None
        session = self._session(request)
        raw = to_chat(body, session)
        chat = parse_request(raw, session.known)
        session.known = (raw["messages"], chat.messages)
        choices, prompt_tokens = await session.complete(chat, self.backend)
        return _Served(session, body, raw, chat, choices, prompt_tokens)

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        try:
            served = await self._complete(request, lambda body, session: body)
        except WireError as exc:
            return web.json_response(exc.body(), status=exc.status)
        request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        chat, choices, prompt_tokens = served.chat, served.choices, served.prompt_tokens
        if not chat.stream:
            return web.json_response(completion_body(request_id, self.model_name, created, choices, prompt_tokens))
        chunks = stream_chunks(request_id, self.model_name, created, choices, prompt_tokens, chat.include_usage)
        return await _stream(
            request, (b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks), b"data: [DONE]\n\n"
        )

    async def _responses_route(self, request: Any) -> Any:
        from aiohttp import web

        def to_chat(body: Any, session: Session) -> dict[str, Any]:
            store = self._responses.setdefault(session.session_id, ResponseStore())
            previous = body.get("previous_response_id") if isinstance(body, dict) else None
            return chat_body(body, store.history(previous))

        try:
            served = await self._complete(request, to_chat)
        except WireError as exc:
            return web.json_response(exc.body(), status=exc.status)
        response_id, body, [choice] = f"resp_{uuid.uuid4().hex}", served.body, served.choices
        self._responses.setdefault(served.session.session_id, ResponseStore()).keep(
            response_id, body, served.raw, choice
        )
        response = response_body(
            response_id, self.model_name, int(time.time()), body, choice, output_items(choice), served.prompt_tokens
        )
        if not served.chat.stream:
            return web.json_response(response)
        events = stream_events(response)
        return await _stream(request, (f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events))

    async def _messages(self, request: Any) -> Any:
        from aiohttp import web

        try:
            served = await self._complete(request, lambda body, session: anthropic.chat_body(body))
        except WireError as exc:
            return web.json_response(anthropic.error_body(exc), status=exc.status)
        message_id, [choice] = f"msg_{uuid.uuid4().hex}", served.choices
        if not served.chat.stream:
            return web.json_response(anthropic.message_body(message_id, self.model_name, choice, served.prompt_tokens))
        events = anthropic.message_events(message_id, self.model_name, choice, served.prompt_tokens)
        return await _stream(
            request, (f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)
        )


@dataclass(frozen=True)
class _Served:
    """One answered request: its session, body as sent, chat-completions body and request, the replies."""

    session: Session
    body: Any
    raw: dict[str, Any]
    chat: ChatRequest
    choices: list[Choice]
    prompt_tokens: int


async def _stream(request: Any, frames: Any, last: bytes = b"") -> Any:
    """Send ``frames`` (then ``last``) as a server-sent-event stream."""
    from aiohttp import web

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
    if last:
        await response.write(last)
    await response.write_eof()
    return response
