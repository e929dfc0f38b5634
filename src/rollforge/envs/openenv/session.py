"""One episode on one OpenEnv server session: the three action modes of ``client.py``.

``OpenEnvSession`` turns the engine's ``reset``/``step`` into OpenEnv requests on a connection it
takes from its ``OpenEnvEnvironment`` (a pooled session or a new one) and gives back on ``close``;
the module docstring of ``client.py`` states the rules (seeds, modes, failures).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...errors import ConnectionLost, EnvironmentError_, ServerError
from ...types import Failure, FailureKind, Message, Sample, ToolCall
from ..base import BaseSession, Reset, Step, append_to_last_user
from .protocol import CAPACITY_REACHED, EXECUTION_ERROR, VALIDATION_ERROR, Connection
from .schema import decode_image, jsonable_row, render_observation

if TYPE_CHECKING:
    from .client import OpenEnvEnvironment


class OpenEnvSession(BaseSession):
    """One episode on one server session (see the module docstring)."""

    def __init__(self, environment: "OpenEnvEnvironment"):
        self.env = environment
        self.connection: Connection | None = None
        self.observation: dict[str, Any] = {}
        self._metadata: Any = None

    @property
    def metadata(self) -> Any:
        return self._metadata

    @property
    def handle(self) -> Any:
        return self

    async def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.connection is not None
        data = await self.connection.request(message)
        observation = data.get("observation")
        if not isinstance(observation, dict):
            raise EnvironmentError_(f"the OpenEnv server replied without an observation: {_short(data)}")
        self.observation = observation
        self._metadata = data.get("metadata", observation.get("metadata"))
        return data

    async def reset(self, sample: Sample) -> Reset:
        env = self.env
        await env.load_schema()
        data = {**jsonable_row(sample.row), "seed": _seed(sample)}
        if env.mode == "rollforge":
            data["prompt"] = [m.to_chat() for m in sample.prompt]
        for attempt in (0, 1):
            self.connection, reused = await env.acquire()
            try:
                reply = await self._request({"type": "reset", "data": data})
                break
            except ConnectionLost:
                if not reused or attempt:  # a pooled session may have died with a server restart
                    raise
                await self.connection.close(timeout=1.0)
            except ServerError as exc:
                raise EnvironmentError_(
                    f"the OpenEnv server at {env.base_url} could not reset: {_explain(exc)}"
                ) from None
        if env.mode == "rollforge":
            return _rollforge_reset(self.observation)
        text, images = self._render(reply)
        prompt = sample.prompt
        if text or images:
            prompt = append_to_last_user(prompt, text, images)
        return Reset(prompt=prompt, tools=env.tools)

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self.connection is None:
            raise EnvironmentError_("step() was called before a successful reset()")
        last = conversation[-1]
        if self.env.mode == "rollforge":
            calls = [c.to_json() for c in last.tool_calls]
            data = await self._checked({"type": "step", "data": {"content": last.content, "tool_calls": calls}})
            return _rollforge_step(self.observation, data)
        if self.env.mode == "text":
            data = await self._checked({"type": "step", "data": {self.env.text_field: last.content}})
            text, images = self._render(data)
            done = bool(data.get("done"))
            messages = () if done and not (text or images) else (Message("user", text, images=images),)
            return Step(messages=messages, reward=_reward(data), terminated=done)
        if not last.tool_calls:
            return Step(terminated=True)  # the model answered without acting
        return await self._tool_calls(last.tool_calls)

    async def _tool_calls(self, calls: Sequence[ToolCall]) -> Step:
        name = self.env.tools[0]["function"]["name"]
        messages: list[Message] = []
        failures: list[Failure] = []
        reward, done = 0.0, False
        for call in calls:
            if call.error is not None:
                failure = Failure("tool_invalid_json", call.error)
            elif call.name != name:
                failure = Failure("tool_unknown", f"unknown tool {call.name!r}; available tools: {name}")
            else:
                try:
                    data = await self._request({"type": "step", "data": dict(call.arguments)})
                except ServerError as exc:
                    kind = _TOOL_FAILURES.get(exc.code)
                    if kind is None:
                        raise EnvironmentError_(f"the OpenEnv server failed a step: {_explain(exc)}") from None
                    failure = Failure(kind, _explain(exc))
                else:
                    text, images = self._render(data)
                    messages.append(Message("tool", text, name=name, images=images, tool_call_id=call.id))
                    reward += _reward(data)
                    done = bool(data.get("done"))
                    if done:
                        break  # the remaining calls of this message are not run
                    continue
            messages.append(Message("tool", f"Error: {failure.message}", name=call.name or None, tool_call_id=call.id))
            failures.append(failure)
        return Step(messages=tuple(messages), reward=reward, terminated=done, failures=tuple(failures))

    async def _checked(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._request(message)
        except ServerError as exc:
            raise EnvironmentError_(f"the OpenEnv server failed a step: {_explain(exc)}") from None

    def _render(self, data: Mapping[str, Any]) -> tuple[str, tuple[bytes, ...]]:
        observation = data.get("observation") or {}
        text, images = render_observation(observation, self.env.image_fields)
        if self.env.render is not None:
            text = self.env.render(observation)
        return text, images

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            await self.env.give_back(connection)


_TOOL_FAILURES: dict[str, FailureKind] = {VALIDATION_ERROR: "tool_bad_arguments", EXECUTION_ERROR: "tool_raised"}


def _explain(exc: ServerError) -> str:
    if exc.code == VALIDATION_ERROR and exc.data.get("errors"):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'action') or 'action'}: {e.get('msg')}"
            for e in exc.data["errors"]
            if isinstance(e, Mapping)
        )
        return f"{exc.code}: {problems}"
    if exc.code == CAPACITY_REACHED:
        return (
            f"{exc} (the server allows max_sessions={exc.data.get('max_sessions', '?')}; raise its "
            "max_concurrent_envs or lower the rollout's concurrency)"
        )
    return str(exc)


def _reward(data: Mapping[str, Any]) -> float:
    value = data.get("reward")
    try:
        return 0.0 if value is None else float(value)
    except (TypeError, ValueError):
        raise EnvironmentError_(f"the OpenEnv server sent a non-numeric reward {value!r}") from None


def _seed(sample: Sample) -> int:
    seed = sample.row.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return seed
    text = json.dumps([sample.task_name, [m.to_chat() for m in sample.prompt]], sort_keys=True)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") % (2**31)


def _messages(items: Any) -> tuple[Message, ...]:
    out = []
    for item in items or ():
        images = tuple(decode_image(i, "images") for i in item.get("images") or ())
        out.append(
            Message(
                item["role"],
                item.get("content") or "",
                name=item.get("name"),
                images=images,
                tool_call_id=item.get("tool_call_id"),
            )
        )
    return tuple(out)


def _stop(value: Any) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _rollforge_reset(observation: Mapping[str, Any]) -> Reset:
    return Reset(
        prompt=_messages(observation.get("messages")),
        tools=tuple(observation.get("tools") or ()),
        stop=_stop(observation.get("stop")),
    )


def _rollforge_step(observation: Mapping[str, Any], data: Mapping[str, Any]) -> Step:
    failures = tuple(Failure(f["kind"], f["message"]) for f in observation.get("failures") or ())
    return Step(
        messages=_messages(observation.get("messages")),
        reward=_reward(data),
        terminated=bool(data.get("done")),
        stop=_stop(observation.get("stop")),
        failures=failures,
    )


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
