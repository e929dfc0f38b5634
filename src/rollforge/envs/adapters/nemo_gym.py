"""NeMo Gym resources servers as rollforge environments, over HTTP; rollforge plays the agent.

``NemoGymEnvironment(url)`` (``--env nemogym:http://host:port``) talks to a running NeMo Gym
resources server with ``httpx``; ``nemo-gym`` itself is never imported (it needs Python 3.13).
Samples are NeMo Gym dataset rows (``nemo_gym_wire.py``: the prompt and tools come from the row's
``responses_create_params``; every column goes to the server as it is). Each episode has its own
HTTP client, so the session cookie the server sets ties the episode's calls together, as NeMo
Gym's own agents do. Two protocols, found from the server's ``/openapi.json`` (``protocol="auto"``)
or named:

- ``resources`` (``SimpleResourcesServer``, driven like NeMo Gym's ``simple_agent``): ``reset``
  posts the row to ``/seed_session``; each tool call of an assistant message is a ``POST
  /<tool name>`` with the arguments as its JSON body, and the response body is the tool message
  (a call of a tool the row does not offer is a ``tool_unknown`` failure and never reaches the
  server; a 404 is ``tool_unknown``, a 422 ``tool_bad_arguments``, any other error status
  ``tool_raised``, and the model still sees the body). A reply without tool calls ends the
  episode, and ``finish`` posts the row plus ``response`` (everything generated, Responses-shaped)
  to ``/verify``: its ``reward`` is the episode's reward.
- ``gymnasium`` (``GymnasiumServer``, driven like ``gymnasium_agent``): ``reset`` posts the row to
  ``/reset`` (an ``observation`` becomes a user message); each assistant message is posted to
  ``/step`` as ``response``; ``info.tool_outputs`` become tool messages, an ``observation`` a user
  message, ``reward`` the turn's reward, and ``terminated`` or ``truncated`` end the episode
  (passed through as ``Step.terminated`` / ``Step.truncated``).
  The server judges the whole response, so rollforge counts what it can see itself: a call that
  is unparseable, of a tool the row does not offer, or whose arguments break the tool's schema
  (``argument_problem``) is answered with an ``Error:`` tool message and left out of the response.
  ``/close`` is called when ``/reset``'s info says ``supports_explicit_close``.

Failures, in rollforge's vocabulary: a verify response with ``mask_sample`` (the reward is not a
measurement: the environment's infrastructure failed) fails the episode as an infrastructure
failure, ``env_timeout`` for NeMo Gym's ``transport_timeout``/``agent_timeout`` and ``env_error``
for every other ``failure_kind``, so it is retried and kept out of group baselines; an unmasked
``failure_kind`` keeps its reward and is recorded in the metadata. An unreachable server is one
``ConfigError`` line at ``prepare``; a lost connection or an error status of the protocol's own
routes fails the episode (``env_error``; an HTTP timeout ``env_timeout``).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from ...errors import ConfigError, EnvironmentError_, EpisodeFailed, require
from ...types import Failure, FailureKind, Message, Sample, ToolCall
from ..base import BaseSession, Environment, Reset, Step
from .nemo_gym_wire import argument_problem, call_id, prompt_of, response_of, tools_of

EXTRA = "nemo-gym"
FAMILY = "nemogym"
PROTOCOLS = ("auto", "resources", "gymnasium")

#: NeMo Gym ``failure_kind``s that are timeouts; every other kind of a masked sample is ``env_error``.
_TIMEOUT_KINDS = frozenset({"transport_timeout", "agent_timeout"})
#: Error statuses of a tool route, as the failure kind the model's call is counted under.
_TOOL_STATUS_KINDS: dict[int, FailureKind] = {404: "tool_unknown", 422: "tool_bad_arguments"}


def _httpx() -> Any:
    return require("httpx", EXTRA, "NeMo Gym environments")


def check_url(url: str) -> None:
    """A ``ConfigError`` unless ``url`` is an http(s) URL."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) < 10:
        raise ConfigError(f"a NeMo Gym server must be an http(s):// URL (nemogym:http://host:port), got {url!r}")


def build(url: str) -> NemoGymEnvironment:
    return NemoGymEnvironment(url)


def samples(url: str, n: int, seed: int) -> list[Sample]:
    raise ConfigError(f"{FAMILY}:{url} has no prompt generator; give the server's dataset rows with --data FILE.jsonl")


def sample(row: Mapping[str, Any], task_name: str = "default") -> Sample:
    """A ``Sample`` of one NeMo Gym dataset row (the prompt read from ``responses_create_params``)."""
    return Sample(prompt=prompt_of(row), task_name=task_name, row=row)


class NemoGymEnvironment(Environment):
    """A NeMo Gym resources server (see the module docstring).

    Args:
        url: The server, e.g. ``http://127.0.0.1:8000``.
        protocol: ``auto`` (from ``/openapi.json``), ``resources`` or ``gymnasium``.
        timeout: Seconds for one HTTP request.
    """

    def __init__(self, url: str, *, protocol: str = "auto", timeout: float = 60.0):
        check_url(url)
        if protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.url = url.rstrip("/")
        self.protocol = protocol
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"NemoGymEnvironment({self.url!r}, protocol={self.protocol!r})"

    def client(self) -> Any:
        """A new HTTP client with its own cookie jar (one episode's server session)."""
        return _httpx().AsyncClient(base_url=self.url, timeout=self.timeout)

    async def prepare(self, sessions: int) -> None:
        """Reach the server once before the rollout: a clear ``ConfigError`` when it cannot be
        reached; settles an ``auto`` protocol."""
        await self._probe()

    async def settle_protocol(self) -> str:
        """The protocol, read from the server when it is ``auto`` (``_probe``)."""
        if self.protocol == "auto":
            await self._probe()
        return self.protocol

    async def _probe(self) -> None:
        """``GET /openapi.json`` (NeMo Gym's servers are FastAPI apps): ``gymnasium`` when it lists
        ``/reset`` and ``/step``, else ``resources``; any answer proves the server is up."""
        httpx = _httpx()
        async with self.client() as client:
            try:
                answer = await client.get("/openapi.json")
            except httpx.HTTPError as exc:
                raise ConfigError(
                    f"cannot reach the NeMo Gym server at {self.url} ({type(exc).__name__}: {exc}); "
                    "start it (ng_run) or fix the URL"
                ) from None
        try:
            paths = answer.json().get("paths", {}) if answer.status_code == 200 else {}
        except (ValueError, AttributeError):
            paths = {}
        if self.protocol == "auto":
            self.protocol = "gymnasium" if "/reset" in paths and "/step" in paths else "resources"

    def offered_tools(self, sample: Sample) -> tuple[dict[str, Any], ...] | None:
        return tools_of(sample.row)

    def open(self, sample: Sample) -> BaseSession:
        return NemoGymSession(self)


class NemoGymSession(BaseSession):
    """One episode: one HTTP client (one server session), driven by the environment's protocol."""

    def __init__(self, env: NemoGymEnvironment):
        self.env = env
        self._client: Any = None
        self._row: Mapping[str, Any] = {}
        self._start = 0  # where the generated part of the conversation begins
        self._tools: dict[str, Mapping[str, Any]] = {}
        self._conversation: tuple[Message, ...] = ()
        self._metadata: dict[str, Any] = {}
        self._explicit_close = False

    @property
    def metadata(self) -> Any:
        return self._metadata

    async def _post(self, path: str, body: Any, *, check: bool = True) -> Any:
        """``POST path``; a transport failure fails the episode, and so does an error status when
        ``check`` (the protocol's own routes)."""
        httpx = _httpx()
        try:
            answer = await self._client.post(path, json=body)
        except httpx.TimeoutException as exc:
            raise EpisodeFailed(
                Failure("env_timeout", f"NeMo Gym {self.env.url}{path} timed out: {type(exc).__name__}")
            ) from None
        except httpx.HTTPError as exc:
            raise EnvironmentError_(f"NeMo Gym {self.env.url}{path} failed: {type(exc).__name__}: {exc}") from None
        if check and answer.status_code >= 400:
            raise EnvironmentError_(f"NeMo Gym {self.env.url}{path} answered {answer.status_code}: {answer.text[:300]}")
        return answer

    async def _json(self, path: str, body: Any) -> dict[str, Any]:
        answer = await self._post(path, body)
        try:
            data = answer.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise EnvironmentError_(
                f"NeMo Gym {self.env.url}{path} did not answer a JSON object: {answer.text[:200]!r}"
            )
        return data

    async def reset(self, sample: Sample) -> Reset:
        protocol = await self.env.settle_protocol()
        self._row, self._client = dict(sample.row), self.env.client()
        tools = tools_of(self._row)
        self._tools = {tool["function"]["name"]: tool for tool in tools}
        prompt = sample.prompt
        if protocol == "resources":
            await self._post("/seed_session", self._row)
        else:
            data = await self._json("/reset", self._row)
            info = data.get("info") if isinstance(data.get("info"), dict) else {}
            self._explicit_close, self._metadata = info.get("supports_explicit_close") is True, info
            if data.get("observation"):
                prompt = (*prompt, Message("user", str(data["observation"])))
        self._start = len(prompt)
        return Reset(prompt=prompt, tools=tools)

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self._client is None:
            raise EnvironmentError_("step() was called before a successful reset()")
        self._conversation = conversation
        if self.env.protocol == "gymnasium":
            return await self._gym_step(conversation)
        position, calls = len(conversation) - 1, conversation[-1].tool_calls
        if not calls:
            return Step(terminated=True)
        messages, failures = [], []
        for index, call in enumerate(calls):
            content, failure = await self._call_tool(call)
            messages.append(
                Message("tool", content, name=call.name or None, tool_call_id=call_id(position, index, call))
            )
            failures += [failure] if failure is not None else []
        self._conversation = (*conversation, *messages)  # /verify sees the last results too
        return Step(messages=tuple(messages), failures=tuple(failures))

    def _invalid(self, call: ToolCall, check_arguments: bool) -> Failure | None:
        """Why ``call`` cannot go to the server: unparseable, a tool the row does not offer, or (when
        ``check_arguments``) arguments that break its schema; else None."""
        if call.error is not None:
            return Failure("tool_invalid_json", call.error)
        tool = self._tools.get(call.name)
        if tool is None:
            return Failure(
                "tool_unknown", f"unknown tool {call.name!r}; available tools: {', '.join(self._tools) or 'none'}"
            )
        problem = argument_problem(tool["function"]["parameters"], call.arguments) if check_arguments else None
        return Failure("tool_bad_arguments", f"{call.name}: {problem}") if problem else None

    async def _call_tool(self, call: ToolCall) -> tuple[str, Failure | None]:
        failure = self._invalid(call, check_arguments=False)  # the tool route's own validation answers 422
        if failure is not None:
            return f"Error: {failure.message}", failure
        answer = await self._post(f"/{call.name}", dict(call.arguments), check=False)
        if answer.status_code < 400:
            return answer.text, None
        kind = _TOOL_STATUS_KINDS.get(answer.status_code, "tool_raised")
        return answer.text, Failure(kind, f"{call.name} answered {answer.status_code}: {answer.text[:300]}")

    async def _gym_step(self, conversation: tuple[Message, ...]) -> Step:
        position, calls = len(conversation) - 1, conversation[-1].tool_calls
        ids = [call_id(position, i, call) for i, call in enumerate(calls)]
        invalid = {ids[i]: (call, failure) for i, call in enumerate(calls) if (failure := self._invalid(call, True))}
        response = response_of(self._row, conversation, position)
        response["output"] = [item for item in response["output"] if item.get("call_id") not in invalid]
        data = await self._json("/step", {**self._row, "response": response})
        info = data.get("info") if isinstance(data.get("info"), dict) else {}
        names = dict(zip(ids, (call.name for call in calls)))
        messages = [
            Message("tool", f"Error: {f.message}", name=c.name or None, tool_call_id=i) for i, (c, f) in invalid.items()
        ]
        messages += [
            Message(
                "tool", str(out.get("output", "")), name=names.get(out.get("call_id")), tool_call_id=out.get("call_id")
            )
            for out in info.get("tool_outputs", ())
            if isinstance(out, Mapping)
        ]
        if data.get("observation"):
            messages.append(Message("user", str(data["observation"])))
        terminated, truncated = bool(data.get("terminated")), bool(data.get("truncated"))
        self._metadata = {**info, "terminated": terminated, "truncated": truncated}
        reward = _number(data.get("reward", 0.0), "/step reward")
        return Step(
            messages=tuple(messages),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            failures=tuple(f for _, f in invalid.values()),
        )

    async def finish(self) -> float:
        if self.env.protocol == "gymnasium":
            return 0.0  # gymnasium servers reward each step
        body = {**self._row, "response": response_of(self._row, self._conversation, self._start)}
        verdict = await self._json("/verify", body)
        self._metadata = {k: v for k, v in verdict.items() if k not in ("responses_create_params", "response")}
        if verdict.get("mask_sample"):
            raise EpisodeFailed(masked_failure(verdict))
        return _number(verdict.get("reward"), "/verify reward")

    async def close(self) -> None:
        if self._client is None:
            return
        try:
            if self._explicit_close:
                await self._post("/close", {})
        finally:
            client, self._client = self._client, None
            await client.aclose()


def masked_failure(verdict: Mapping[str, Any]) -> Failure:
    """The rollforge failure of a verify response with ``mask_sample`` (see the module docstring)."""
    kind = verdict.get("failure_kind")
    reason = verdict.get("failure_reason") or "no failure_reason given"
    mapped: FailureKind = "env_timeout" if kind in _TIMEOUT_KINDS else "env_error"
    return Failure(mapped, f"NeMo Gym masked the sample (failure_kind {kind or 'none'}): {reason}")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise EnvironmentError_(f"NeMo Gym {what} must be a finite number, got {json.dumps(value, default=str)[:80]}")
    return float(value)
