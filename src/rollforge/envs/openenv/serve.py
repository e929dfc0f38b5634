"""Serve a rollforge environment as an OpenEnv server (``rollforge env serve NAME``).

Design: ``build_app(environment, ...)`` wraps any rollforge ``Environment`` in an OpenEnv
``Environment`` subclass and hands it to ``openenv``'s own ``create_app``, so the server speaks
exactly OpenEnv's protocol and any OpenEnv client (``GenericEnvClient``, a TRL environment class
wrapping one, or rollforge's ``OpenEnvEnvironment``) can play it. Each OpenEnv session holds one
rollforge session (one episode at a time; ``reset`` starts the next one). The session methods live
in ``_ServedSessions``, which ``build_app`` mixes into OpenEnv's base class there, where openenv
is imported.

The wire types, kept generic so that every rollforge environment fits:

- ``RollforgeAction``: one assistant message, ``content`` (its text) and ``tool_calls``
  (``[{"name", "arguments"}]``), e.g. ``{"tool_calls": [{"name": "move", "arguments":
  {"direction": "left"}}]}`` for ``catch``; ``{"content": "The answer is 7."}`` for text
  environments.
- ``RollforgeObservation``: ``text`` (the new messages' text, for clients that show one string),
  ``messages`` (role, content, name, base64 ``images``), ``tools`` (OpenAI function schemas, on
  reset), ``stop`` (next turn's stop strings or null), ``failures`` (counted bad tool calls) and
  the usual ``done``/``reward``; ``metadata`` carries the step-style metadata. The ``images``
  field exists only when the environment declares ``produces_images``.

``reset(seed=s)`` alone plays the library sample ``samples(1, s)[0]`` (the same one for the same
seed). ``reset(prompt=[...], **columns)`` plays the given conversation and row instead, which is
what rollforge's client sends, so a served environment sees the very same sample as a local one.
A step's reward is the wrapped environment's step reward, plus its final reward (``finish``)
on the step that ends the episode. ``openenv`` is imported only here (extra ``openenv-server``).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Callable

from ...errors import ConfigError, require
from ...json_forms import image_bytes
from ...types import Message, Sample, ToolCall
from ..base import Environment


def build_app(
    environment_factory: Callable[[], Environment],
    *,
    name: str,
    samples: Callable[[int, int], list[Sample]],
    max_concurrent: int = 1,
    produces_images: bool = False,
) -> Any:
    """A FastAPI app serving ``environment_factory()``'s sessions over OpenEnv's protocol."""
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
        raise ConfigError(f"max_concurrent must be a positive int, got {max_concurrent!r}")
    require("openenv.core.env_server", "openenv-server", "rollforge env serve")
    from openenv.core.env_server import Action, Environment as OpenEnvBase, Observation, State, create_app
    from pydantic import Field, create_model

    class RollforgeAction(Action):
        """One assistant message: its text and the tool calls in it ([{"name", "arguments"}])."""

        content: str = Field(default="", description="The text of the assistant message")
        tool_calls: list[dict[str, Any]] = Field(
            default_factory=list, description='[{"name": ..., "arguments": {...}}]'
        )

    image_field: dict[str, Any] = {}
    if produces_images:
        image_field["images"] = (
            list[str],
            Field(
                default_factory=list,
                json_schema_extra={"items": {"contentMediaType": "image/png", "contentEncoding": "base64"}},
            ),
        )
    RollforgeObservation = create_model(  # noqa: N806 - a class
        "RollforgeObservation",
        __base__=Observation,
        __doc__="What the environment said: new messages, tools (on reset), stop strings, failures.",
        text=(str, ""),
        messages=(list[dict[str, Any]], Field(default_factory=list)),
        tools=(list[dict[str, Any]], Field(default_factory=list)),
        stop=(list[str] | None, None),
        failures=(list[dict[str, str]], Field(default_factory=list)),
        **image_field,
    )

    class ServedEnvironment(_ServedSessions, OpenEnvBase):
        SUPPORTS_CONCURRENT_SESSIONS = True
        _environment = environment_factory()  # one rollforge Environment; one session per OpenEnv session
        _samples, _name, _produces_images = staticmethod(samples), name, produces_images
        _observation_type, _state_type = RollforgeObservation, State

    ServedEnvironment.__name__ = ServedEnvironment.__qualname__ = f"Served_{name}"
    return create_app(
        ServedEnvironment, RollforgeAction, RollforgeObservation, env_name=name, max_concurrent_envs=max_concurrent
    )


class _ServedSessions:
    """The OpenEnv ``Environment`` methods of ``build_app``'s served class, which mixes this into
    OpenEnv's base and sets the class attributes below; one instance plays one OpenEnv session."""

    _environment: Environment
    _samples: Callable[[int, int], list[Sample]]
    _name: str
    _produces_images: bool
    _observation_type: Any  # the RollforgeObservation model
    _state_type: Any  # OpenEnv's State

    def __init__(self) -> None:
        super().__init__()
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conversation: list[Message] = []
        self._state = self._state_type(step_count=0)

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None, **columns: Any) -> Any:
        await self._end_episode()
        prompt = columns.pop("prompt", None)
        if prompt is None:
            sample = self._samples(1, 0 if seed is None else int(seed))[0]
        else:
            row = dict(columns) if seed is None else {**columns, "seed": seed}
            sample = Sample(prompt=tuple(Message.coerce(m) for m in prompt), task_name=self._name, row=row)
        self._loop = asyncio.get_running_loop()
        self._session = self._environment.open(sample)
        reset = await self._session.reset(sample)
        self._conversation = list(reset.prompt)
        self._state = self._state_type(episode_id=episode_id, step_count=0)
        return self._observation(reset.prompt, tools=list(reset.tools), stop=reset.stop)

    async def step_async(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
        if self._session is None:
            raise RuntimeError("step before reset: send a reset first")
        calls = tuple(
            ToolCall(
                name=str(c.get("name", "")), arguments=c.get("arguments") or {}, id=c.get("id"), error=c.get("error")
            )
            for c in action.tool_calls
        )
        self._conversation.append(Message("assistant", action.content, tool_calls=calls))
        step = await self._session.step(tuple(self._conversation))
        self._conversation += step.messages
        self._state.step_count += 1
        reward = float(step.reward)
        if step.ending:  # OpenEnv's ``done`` is either ending
            reward += float(await self._session.finish())
            await self._end_episode()
        return self._observation(
            step.messages, stop=step.stop, failures=step.failures, done=bool(step.ending), reward=reward
        )

    def _observation(self, messages, *, tools=(), stop=None, failures=(), done=False, reward=None) -> Any:
        encoded = [_message_json(m) for m in messages]
        extra = {"images": [i for m in encoded for i in m.get("images", ())]} if self._produces_images else {}
        return self._observation_type(
            text="\n\n".join(m.content for m in messages if m.content),
            messages=encoded,
            tools=[dict(t) for t in tools],
            stop=None if stop is None else list(stop),
            failures=[f.to_json() for f in failures],
            done=done,
            reward=reward,
            metadata=_json_metadata(self._session.metadata if self._session is not None else None),
            **extra,
        )

    async def _end_episode(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **columns: Any) -> Any:
        return asyncio.run(self.reset_async(seed, episode_id, **columns))

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        return asyncio.run(self.step_async(action, timeout_s, **kwargs))

    @property
    def state(self) -> Any:
        return self._state

    def close(self) -> None:  # called by the server in a worker thread when the session ends
        if self._session is not None and self._loop is not None and self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._end_episode(), self._loop)
            try:
                future.result(timeout=30)
            except Exception:
                pass  # the episode's resources are best-effort here; the server goes on


def serve(name: str, *, host: str = "127.0.0.1", port: int = 8000, max_concurrent: int = 1) -> None:
    """Serve the bundled environment ``name`` until interrupted."""
    from ..library import get_env_spec

    spec = get_env_spec(name)
    app = build_app(
        spec.build,
        name=spec.name,
        samples=spec.samples,
        max_concurrent=max_concurrent,
        produces_images=spec.build().produces_images,
    )
    uvicorn = require("uvicorn", "openenv-server", "rollforge env serve")
    print(f"serving {name!r} on http://{host}:{port} (at most {max_concurrent} sessions at once)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _message_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.images:  # always sent: a client with a text-only model must learn of them
        out["images"] = [base64.b64encode(image_bytes(i)[1]).decode("ascii") for i in message.images]
    return out


def _json_metadata(value: Any) -> dict[str, Any]:
    """OpenEnv's metadata is a dict: step-style metadata that is a dict goes as it is."""
    import json

    if value is None:
        return {}
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value if isinstance(value, dict) else {"value": value}
