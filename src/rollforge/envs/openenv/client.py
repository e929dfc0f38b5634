"""OpenEnv servers as rollforge environments: one WebSocket session per running episode.

``OpenEnvEnvironment(url)`` speaks OpenEnv's WebSocket protocol (``protocol.py``) itself, on the
``websockets`` package: ``openenv`` is not imported (its import takes seconds and pulls gradio).

Per episode (``OpenEnvSession``):

- ``reset``: take a connection (a server session), send ``reset`` with ``seed`` (the row's
  ``seed`` column, else a stable hash of the prompt, so the same sample always gets the same
  seed) and the row's other JSON columns. The observation's text is appended to the last user
  message, as an environment class's ``reset`` string is.
- ``step``, tool mode (default): the action schema from ``/schema`` is offered as one tool
  (``schema.py``); each tool call of the assistant message is one ``step`` request, in order,
  until the server says ``done``. The observation becomes the tool message. A call the server
  rejects with ``VALIDATION_ERROR`` is a counted ``tool_bad_arguments`` failure and one it fails
  with ``EXECUTION_ERROR`` a ``tool_raised`` failure; the model is told and the episode goes on.
  A reply without tool calls ends the episode, as for environment classes.
- ``step``, text mode (``text_field="answer"``): no tools; the assistant's whole message is sent
  as that action field and the observation comes back as a user message (chat and single-turn
  environments such as OpenEnv's echo env).
- ``step``, rollforge mode: a server started by ``rollforge env serve`` (action class
  ``RollforgeAction``) gets the whole assistant message and answers with the wrapped
  environment's own tools, messages, stop strings and failures, so a served environment
  behaves exactly as the local one.
- Rewards: each step's ``reward`` (None is 0); ``done`` terminates. ``metadata`` is the last
  observation's metadata.

Failures: an error frame other than the two above, a refused session (``CAPACITY_REACHED``) and a
lost connection (server killed or restarted) raise ``EnvironmentError_``: the engine records the
episode as failed with that reason and goes on. New episodes open new connections; a connection
refused while a server restarts is retried for ``connect_timeout`` seconds.

Capacity: the engine calls ``prepare(sessions)`` once before a rollout with the number of episodes
that may run at once against this server. It opens that many sessions (which checks the server's
``max_concurrent_envs`` for real, with a ``ConfigError`` saying what to set when it is too low) and
keeps them for the episodes: an episode whose connection is still in step hands its session to the next (whose
``reset`` starts afresh), so a rollout opens each session once. ``release()`` ends them. Without
``prepare`` (``check_env``, direct use) every episode opens and closes its own session.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import weakref
from typing import Any, Callable, Mapping, Sequence

from ...errors import ConfigError, EnvironmentError_, ServerError
from ...types import Sample
from ...workers import run_blocking
from ..base import Environment, check_max_sessions
from .protocol import CAPACITY_REACHED, Connection, websocket_url
from .schema import action_tool, image_fields
from .session import OpenEnvSession

#: The action class name of servers started by ``rollforge env serve`` (rollforge mode).
ROLLFORGE_ACTION = "RollforgeAction"

__all__ = ["OpenEnvEnvironment", "ROLLFORGE_ACTION"]


class OpenEnvEnvironment(Environment):
    """An environment served by an OpenEnv server (see the module docstring).

    Args:
        base_url: The server, e.g. ``http://127.0.0.1:8000``.
        tool_name: Name of the action tool (default: from the action class name).
        tool_description: Its description (default: the action class's docstring).
        text_field: Text mode: send the assistant's message as this action field; no tools.
        image_fields: Observation fields holding base64 images, besides those the schema marks.
        render: ``render(observation_dict) -> str`` replacing the default text rendering.
        max_sessions: The server's session limit, when known (checked by the engine up front).
        connect_timeout: Seconds to keep retrying a refused connection (a restarting server).
    """

    def __init__(
        self,
        base_url: str,
        *,
        tool_name: str | None = None,
        tool_description: str | None = None,
        text_field: str | None = None,
        image_fields: Sequence[str] = (),
        render: Callable[[Mapping[str, Any]], str] | None = None,
        max_sessions: int | None = None,
        connect_timeout: float = 10.0,
    ):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://", "ws://", "wss://")):
            raise ConfigError(f"base_url must be an http(s):// or ws(s):// URL of an OpenEnv server, got {base_url!r}")
        check_max_sessions(max_sessions)
        self.base_url = base_url.rstrip("/")
        self.ws_url = websocket_url(self.base_url)
        self.http_url = (
            self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1).removesuffix("/ws")
        )
        self.tool_name, self.tool_description = tool_name, tool_description
        self.text_field = text_field
        self.render = render
        self.max_sessions = max_sessions
        self.connect_timeout = connect_timeout
        self._declared_images = tuple(image_fields)
        self.schema: dict[str, Any] | None = None
        self.tools: tuple[dict[str, Any], ...] = ()
        self.image_fields: frozenset[str] = frozenset()
        self.mode = "tool"
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Connection]] = (
            weakref.WeakKeyDictionary()
        )

    def __getstate__(self) -> dict[str, Any]:
        """A copy (shipped to an environment actor) opens its own connections."""
        state = dict(self.__dict__)
        del state["_pools"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pools = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"OpenEnvEnvironment({self.base_url!r}, mode={self.mode!r})"

    @property
    def produces_images(self) -> bool:
        """Whether observations may carry images (known once the schema was read)."""
        if self.mode == "rollforge":
            return "images" in ((self.schema or {}).get("observation", {}).get("properties") or {})
        return bool(self.image_fields)

    # -- schema ----------------------------------------------------------------------------------

    async def load_schema(self) -> dict[str, Any]:
        """``GET /schema`` once; derive the mode, the tool and the image fields."""
        if self.schema is not None:
            return self.schema
        schema = await run_blocking(self._get_json, "/schema")
        action = schema.get("action") if isinstance(schema, dict) else None
        if not isinstance(action, dict):
            raise EnvironmentError_(f"{self.http_url}/schema has no action schema; is this an OpenEnv server?")
        properties = action.get("properties") or {}
        if action.get("title") == ROLLFORGE_ACTION:
            self.mode, self.tools = "rollforge", ()
        elif self.text_field is not None:
            if self.text_field not in properties:
                raise ConfigError(
                    f"text_field={self.text_field!r} is not a field of the server's action "
                    f"{action.get('title')!r}; its fields are: {', '.join(k for k in properties if k != 'metadata')}"
                )
            self.mode, self.tools = "text", ()
        else:
            self.mode, self.tools = (
                "tool",
                (action_tool(action, name=self.tool_name, description=self.tool_description),),
            )
        self.image_fields = image_fields(schema.get("observation"), self._declared_images)
        self.schema = schema
        return schema

    def _get_json(self, path: str) -> Any:
        url = self.http_url + path
        try:
            with urllib.request.urlopen(url, timeout=self.connect_timeout) as response:
                return json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise EnvironmentError_(f"cannot read {url}: {type(exc).__name__}: {exc}") from None

    # -- sessions ---------------------------------------------------------------------------------

    async def prepare(self, sessions: int) -> None:
        """Open ``sessions`` server sessions for the episodes to come; fail early when the server
        does not allow that many (see the module docstring)."""
        await self.load_schema()
        opened = await asyncio.gather(*(self._probe() for _ in range(sessions)), return_exceptions=True)
        good = [c for c in opened if isinstance(c, Connection)]
        refused = [e for e in opened if isinstance(e, ServerError) and e.code == CAPACITY_REACHED]
        other = [e for e in opened if isinstance(e, BaseException) and e not in refused]
        if refused or other:
            await asyncio.gather(*(c.close() for c in good))
            if refused:
                data = refused[0].data
                raise ConfigError(
                    f"the OpenEnv server at {self.base_url} refused {len(refused)} of the {sessions} sessions "
                    f"the rollout runs at once (it allows max_sessions={data.get('max_sessions', '?')}); start it "
                    f"with create_app(..., max_concurrent_envs={sessions}) or more, and set "
                    f"SUPPORTS_CONCURRENT_SESSIONS = True on its Environment class (required above 1), "
                    f"or lower the rollout's concurrency to {len(good)}"
                )
            raise other[0]
        self._pools.setdefault(asyncio.get_running_loop(), []).extend(good)

    async def _probe(self) -> Connection:
        connection = await Connection.open(self.ws_url, timeout=self.connect_timeout)
        try:
            await connection.request({"type": "state"})  # any reply but CAPACITY_REACHED: a session exists
        except ServerError as exc:
            if exc.code == CAPACITY_REACHED:
                await connection.close()
                raise
        except BaseException:
            await connection.close()
            raise
        return connection

    async def release(self) -> None:
        """End the sessions ``prepare`` opened (and those episodes handed back)."""
        pool = self._pools.pop(asyncio.get_running_loop(), [])
        await asyncio.gather(*(c.close() for c in pool))

    async def acquire(self) -> tuple[Connection, bool]:
        """A connection for one episode, and whether it was reused from the pool."""
        pool = self._pools.get(asyncio.get_running_loop())
        while pool:
            connection = pool.pop()
            if connection.open_now:
                return connection, True
            await connection.close(timeout=1.0)
        return await Connection.open(self.ws_url, timeout=self.connect_timeout), False

    async def give_back(self, connection: Connection) -> None:
        pool = self._pools.get(asyncio.get_running_loop())
        if pool is not None and connection.open_now:
            pool.append(connection)
        else:
            await connection.close()

    def open(self, sample: Sample) -> OpenEnvSession:
        return OpenEnvSession(self)
