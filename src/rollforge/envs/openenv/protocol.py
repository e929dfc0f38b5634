"""OpenEnv's wire protocol, client side: one WebSocket connection = one server session.

What an OpenEnv server (``openenv.core.env_server.create_app``, version 0.10) speaks, as read
from its source:

- ``GET /schema`` -> ``{"action": <JSON schema>, "observation": ..., "state": ...,
  "reset_observation": ...}`` (pydantic schemas of the server's Action/Observation classes).
- ``WS /ws``: the server creates a session (an environment instance) when the socket opens. If it
  already holds ``max_concurrent_envs`` sessions it sends one error frame with code
  ``CAPACITY_REACHED`` (plus ``active_sessions`` and ``max_sessions``) and closes. Then requests
  and replies strictly alternate: ``{"type": "reset", "data": {seed, ...}}`` and
  ``{"type": "step", "data": <action>}`` are answered by ``{"type": "observation", "data":
  {"observation": {...}, "reward": r, "done": d, "metadata"?: {...}}}``; ``{"type": "state"}``
  by ``{"type": "state", "data": {...}}``; ``{"type": "close"}`` makes the server destroy the
  session and close the socket. A failed request is answered by ``{"type": "error", "data":
  {"message", "code", ...}}`` with codes ``VALIDATION_ERROR`` (the action does not fit the
  schema; ``errors`` lists pydantic's complaints) and ``EXECUTION_ERROR`` (the environment
  raised); the session stays usable after both.
- The HTTP ``/reset`` and ``/step`` routes are stateless (a fresh environment per request) and are
  not used.

``Connection`` is deliberately small: ``request`` sends one message and reads its reply, turning
error frames into ``ServerError`` and a lost socket into ``ConnectionLost``. A request that is
cancelled half-way (a timeout) leaves the socket out of step with the server, so the connection
marks itself unusable; the caller then closes it instead of reusing it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from ...errors import ConnectionLost, ServerError, require

#: Error codes an OpenEnv server puts in ``data.code`` of an error frame.
CAPACITY_REACHED = "CAPACITY_REACHED"
VALIDATION_ERROR = "VALIDATION_ERROR"
EXECUTION_ERROR = "EXECUTION_ERROR"


def websocket_url(base_url: str) -> str:
    """``http://host:port`` (or ``ws://``) -> ``ws://host:port/ws``."""
    url = base_url.rstrip("/")
    for http, ws in (("https://", "wss://"), ("http://", "ws://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    return url if url.endswith("/ws") else url + "/ws"


class Connection:
    """One open WebSocket to an OpenEnv server, holding one server session."""

    def __init__(self, ws: Any, url: str):
        self._ws = ws
        self.url = url
        #: False once a request was interrupted or the socket failed: never reuse it then.
        self.usable = True
        self.loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, url: str, *, timeout: float, retry_refused: bool = True) -> "Connection":
        """Connect, retrying refused connections (a server restarting) until ``timeout``."""
        connect = require("websockets.asyncio.client", "openenv", "the OpenEnv client").connect
        deadline = asyncio.get_running_loop().time() + timeout
        delay = 0.05
        while True:
            try:
                ws = await asyncio.wait_for(
                    connect(url, max_size=None, compression=None, ping_interval=None, proxy=None),
                    timeout=max(0.01, deadline - asyncio.get_running_loop().time()),
                )
                return cls(ws, url)
            except (OSError, asyncio.TimeoutError) as exc:
                left = deadline - asyncio.get_running_loop().time()
                if not retry_refused or left <= 0 or not isinstance(exc, OSError):
                    raise ConnectionLost(
                        f"cannot connect to the OpenEnv server at {url} within {timeout}s: {type(exc).__name__}: {exc}"
                    ) from None
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)
            except Exception as exc:  # handshake rejected (404: not an OpenEnv server, ...)
                raise ConnectionLost(f"cannot open a WebSocket to {url}: {type(exc).__name__}: {exc}") from None

    @property
    def open_now(self) -> bool:
        """Whether the socket is still open (a server restart closes idle sockets too)."""
        return self.usable and getattr(self._ws, "close_code", None) is None

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send ``message``; return the ``data`` of the reply. Raises ``ServerError`` for an error
        frame (the session stays usable) and ``ConnectionLost`` when the socket fails."""
        if not self.usable:
            raise ConnectionLost(f"the connection to {self.url} is no longer usable")
        self.usable = False  # until the reply is read: a cancellation here desynchronises the socket
        try:
            try:
                await self._ws.send(json.dumps(message))
            except Exception:
                pass  # a refused session sends its error frame, then closes: read it below
            raw = await self._ws.recv()
        except Exception as exc:  # (a cancellation passes through and leaves usable False)
            raise ConnectionLost(self._lost_reason(exc)) from None
        reply = json.loads(raw)
        if reply.get("type") == "error":
            data = reply.get("data") or {}
            code = str(data.get("code", "UNKNOWN"))
            if code != CAPACITY_REACHED:
                self.usable = True
            raise ServerError(code, str(data.get("message", "")), data)
        self.usable = True
        return reply.get("data") or {}

    def _lost_reason(self, exc: BaseException) -> str:
        code = getattr(self._ws, "close_code", None)
        how = f"closed with code {code}" if code is not None else f"{type(exc).__name__}: {exc}"
        return f"the connection to the OpenEnv server at {self.url} was lost ({how}); the server stopped or restarted"

    async def close(self, *, timeout: float = 5.0) -> None:
        """End the server session (``{"type": "close"}``) and wait, bounded, for the server to close
        the socket, so that its session slot is free when this returns. Never raises."""
        ws, self.usable = self._ws, False
        if asyncio.get_running_loop() is not self.loop:  # the loop that owned it is gone
            return
        try:
            async with asyncio.timeout(timeout):
                if getattr(ws, "close_code", None) is None:
                    try:
                        await ws.send('{"type": "close"}')
                        while True:  # drain until the server closes (after freeing the slot)
                            await ws.recv()
                    except Exception:
                        pass
                await ws.close()
        except Exception:
            pass  # best effort: the server frees the session when the socket drops anyway
