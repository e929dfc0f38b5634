"""Typed, frozen values that flow between the layers of rollforge.

A ``Sample`` goes into the engine, a ``Trajectory`` comes out. Between them, backends exchange
``Completion`` values and environments exchange ``Message`` values. Nothing here does I/O.

Invariants a ``Trajectory`` checks on construction (a violation is a rollforge bug, raised as
``InvariantError``): ``token_ids``, ``loss_mask`` and ``logprobs`` have the same length; the mask is
0/1; a token has a logprob exactly when its mask is 1 (policy tokens); ``rewards`` has one entry per
turn and ``total_reward`` is their sum; ``ending`` is ``error`` exactly when ``error`` is set; the
``segments`` laid end to end are exactly ``token_ids`` / ``loss_mask`` / ``logprobs``.

An episode's ending is one field, ``Trajectory.ending``; ``terminated``, ``truncated``,
``max_turns_reached`` and ``outcome`` are read from it (``endings.py`` tells the vocabulary), and
the JSON record keeps its three flags.

Segments: a chat template that rewrites history (Qwen3 and DeepSeek-R1 drop past reasoning) cannot
be rendered by appending, so such an episode continues in a new ``Segment`` whose prompt is the
template's own rendering of the conversation so far. Each segment is one sequence the model saw,
token-exact against its rendering; training uses each as a sequence. Most episodes have one.

Where an episode was served on a Ray cluster (its environment actor and generation replica, each
with its node) is ``Trajectory.served_by`` (``placement.py``); it is empty when it ran here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Mapping

# ``Completion`` (what a backend returns) lives in ``completion``; its names are read from here too.
from .completion import FINISH_REASONS, Completion, FinishReason

# The vocabulary of endings (and ``Failure``) lives in ``endings``; its names are read from here too.
from .endings import INFRA_FAILURES, Ending, Failure, FailureKind, Outcome, ending_of, outcome_of
from .errors import InvariantError
from .json_forms import image_json, json_float, jsonable
from .invariants import check_segments, check_trajectory
from .placement import HERE, ServedBy

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A tool call parsed from the model's text: ``arguments`` is the decoded JSON object."""

    name: str
    arguments: Mapping[str, Any]
    id: str | None = None
    #: Set when the call could not be parsed (invalid JSON, no "name"): the environment replies
    #: with this error instead of running anything.
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": dict(self.arguments), "id": self.id}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class Message:
    """One chat message. Assistant messages keep their raw generated text as ``content`` (tool-call
    markup included) so the chat template renders exactly the tokens the policy produced;
    ``tool_calls`` holds what was parsed out of it. ``name`` is the tool name of a ``tool`` message
    and ``tool_call_id`` the id of the call it answers. ``images`` holds images a tool returned (PIL
    images or encoded bytes), passed to backends that accept them."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    name: str | None = None
    images: tuple[Any, ...] = ()
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant", "tool"):
            raise InvariantError(f"message role {self.role!r} is not one of system/user/assistant/tool")
        if not isinstance(self.content, str):
            raise InvariantError(f"message content must be str, got {type(self.content).__name__}")

    def to_chat(self) -> dict[str, Any]:
        """The dict a chat template renders, in the OpenAI/Hugging Face shape: role and content,
        ``tool_calls`` as ``[{"id", "type": "function", "function": {"name", "arguments"}}]``
        (arguments as a dict, as Hugging Face templates read them; calls that could not be parsed
        are left out), ``name`` and ``tool_call_id`` of tool results."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        calls = [c for c in self.tool_calls if c.error is None]
        if calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                for c in calls
            ]
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.images:
            out["images"] = [image_json(image) for image in self.images]
        return out

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Message:
        """Read back ``to_json``; images come back as their encoded bytes."""
        import base64

        calls = tuple(
            ToolCall(c["name"], c.get("arguments") or {}, c.get("id"), c.get("error"))
            for c in record.get("tool_calls") or ()
        )
        images = tuple(base64.b64decode(i["base64"]) for i in record.get("images") or ())
        return cls(record["role"], record["content"], calls, record.get("name"), images, record.get("tool_call_id"))

    @classmethod
    def coerce(cls, value: Message | Mapping[str, Any]) -> Message:
        """Accept a ``Message`` or a ``{"role", "content"}`` dict (the form datasets hold)."""
        if isinstance(value, Message):
            return value
        if not isinstance(value, Mapping) or "role" not in value or "content" not in value:
            raise InvariantError(f"expected a message dict with 'role' and 'content', got {value!r}")
        calls = tuple(_coerce_call(c) for c in value.get("tool_calls") or ())
        return cls(
            role=value["role"],
            content=value["content"],
            tool_calls=calls,
            name=value.get("name"),
            tool_call_id=value.get("tool_call_id"),
        )


def _coerce_call(value: Any) -> ToolCall:
    """A tool call of a dataset message, in the OpenAI shape (``{"id", "type", "function": {"name",
    "arguments"}}``, arguments a dict or a JSON string) or the ``ToolCall.to_json`` one."""
    import json

    if isinstance(value, ToolCall):
        return value
    if not isinstance(value, Mapping):
        raise InvariantError(f"expected a tool call dict, got {value!r}")
    function = value.get("function", value)
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise InvariantError(f"tool call arguments are not JSON: {arguments!r}") from None
    if not isinstance(function.get("name"), str) or not isinstance(arguments, Mapping):
        raise InvariantError(f"a tool call needs a name and an arguments object, got {value!r}")
    return ToolCall(function["name"], arguments, value.get("id"))


@dataclass(frozen=True)
class Sample:
    """One rollout request.

    ``prompt`` is the opening conversation. ``task_name`` routes the sample to its environment.
    ``row`` holds the dataset columns: environment classes receive them as ``reset(**row)``,
    step-style environments receive ``row["metadata"]`` (or the whole row) as their metadata.
    ``stop`` are stop strings for the first turn (environments may change them per turn).
    """

    prompt: tuple[Message, ...]
    task_name: str = "default"
    row: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(Message.coerce(m) for m in self.prompt))
        object.__setattr__(self, "row", MappingProxyType(dict(self.row)))
        object.__setattr__(self, "stop", tuple(self.stop))
        if not self.prompt:
            raise InvariantError("a sample needs at least one prompt message")


@dataclass(frozen=True)
class Segment:
    """One sequence the model saw: its prompt (the template's rendering of the conversation so far,
    mask 0: ``prompt_length`` tokens, generation prompt included except in the first segment,
    whose prompt_length is the episode's as before), then generated tokens (mask 1, with their
    logprobs) and the observations appended after them (mask 0). ``messages``: how many of the
    trajectory's messages its ids render (the rest came after it). ``history``: the messages its
    ids render when they are not the trajectory's first ones (an agent sent a rewritten history
    back after it, e.g. its replies as "Calling tools: [...]" text); empty otherwise. ``tools``: the
    tool schemas its prompt rendered when they are not the trajectory's (``Trajectory.tools``, the
    last segment's): two agents of one gateway session, each with its own tools; None otherwise."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    prompt_length: int
    messages: int
    history: tuple[Message, ...] = ()
    tools: tuple[Mapping[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": [json_float(lp) for lp in self.logprobs],
            "prompt_length": self.prompt_length,
            "messages": self.messages,
            **({"history": [m.to_json() for m in self.history]} if self.history else {}),
            **({"tools": jsonable(self.tools)} if self.tools is not None else {}),
        }


@dataclass(frozen=True, repr=False)
class Trajectory:
    """One finished episode. See the module docstring for the invariants it checks."""

    index: int
    task_name: str
    messages: tuple[Message, ...]
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    prompt_length: int
    rewards: tuple[float, ...]
    total_reward: float
    turns: int
    #: How the episode ended (see ``Ending``); ``error`` exactly when ``error`` is set.
    ending: Ending = "terminated"
    error: Failure | None = None
    failures: tuple[Failure, ...] = ()
    metadata: Any = None
    #: Tool schemas the chat template rendered (empty when the tools were described in the system
    #: message instead); ``messages`` rendered with these tools reproduce ``token_ids``.
    tools: tuple[Mapping[str, Any], ...] = ()
    generation_seconds: float = 0.0
    environment_seconds: float = 0.0
    #: How many of ``messages`` are the prompt the episode rendered (with an injected tool system
    #: prompt and what ``reset`` added); the rest were generated after it. None: not recorded.
    prompt_messages: int | None = None
    #: The live environment object of the episode (an ``environment_factory`` instance), kept for
    #: reward functions that take ``environments=``; never serialised.
    environment: Any = field(default=None, compare=False, repr=False)
    #: The sequences the model saw, in order (see the module docstring). Left empty, it is the one
    #: segment ``token_ids``; with several, ``token_ids`` / ``loss_mask`` / ``logprobs`` are the
    #: segments one after another (every token the episode rendered or generated, but not one
    #: sequence: train on the segments) and ``prompt_length`` is the first segment's.
    segments: tuple[Segment, ...] = ()
    #: The weight version that generated each policy token, in order (one per mask-1 token); empty
    #: when the backend does not say (it is versioned during asynchronous training).
    versions: tuple[int, ...] = ()
    #: Times the episode was run again after an infrastructure failure (this is the last run).
    retries: int = 0
    #: The Ray environment actor and generation replica that served the (last run of the) episode,
    #: each with its node (``placement.py``); empty when both sides ran in this process.
    served_by: ServedBy = HERE

    def __post_init__(self) -> None:
        if self.versions and len(self.versions) != sum(self.loss_mask):
            raise InvariantError(
                f"trajectory {self.index}: {len(self.versions)} weight versions for {sum(self.loss_mask)} policy tokens"
            )
        if not self.segments:
            whole = Segment(self.token_ids, self.loss_mask, self.logprobs, self.prompt_length, len(self.messages))
            object.__setattr__(self, "segments", (whole,))
        elif len(self.segments) > 1 or self.segments[0].token_ids is not self.token_ids:
            check_segments(self)
        check_trajectory(self)

    def __repr__(self) -> str:
        return (
            f"Trajectory(index={self.index}, task_name={self.task_name!r}, turns={self.turns}, "
            f"tokens={len(self.token_ids)}, total_reward={self.total_reward}, {self.ending})"
        )

    @property
    def terminated(self) -> bool:
        """The task reached an end state (natural termination)."""
        return self.ending == "terminated"

    @property
    def truncated(self) -> bool:
        """A limit outside the task cut the episode off (``max_seq_len``, or the environment's own)."""
        return self.ending == "truncated"

    @property
    def max_turns_reached(self) -> bool:
        """The rollout's turn limit ended the episode."""
        return self.ending == "max_turns_reached"

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def outcome(self) -> Outcome:
        """``completed``, ``policy_failure`` or ``infra_failure`` (see ``endings``)."""
        return outcome_of(self.error.kind if self.error is not None else None)

    def to_json(self) -> dict[str, Any]:
        """The ``trajectories.jsonl`` record."""
        return {
            "index": self.index,
            "task_name": self.task_name,
            "messages": [m.to_json() for m in self.messages],
            "token_ids": list(self.token_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": [json_float(lp) for lp in self.logprobs],
            "prompt_length": self.prompt_length,
            "prompt_messages": self.prompt_messages,
            "rewards": [json_float(r) for r in self.rewards],
            "total_reward": json_float(self.total_reward),
            "turns": self.turns,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "max_turns_reached": self.max_turns_reached,
            "error": self.error.to_json() if self.error else None,
            "failures": [f.to_json() for f in self.failures],
            "metadata": jsonable(self.metadata),
            "tools": jsonable(self.tools),
            "generation_seconds": json_float(self.generation_seconds),
            "environment_seconds": json_float(self.environment_seconds),
            "retries": self.retries,
            **({"segments": [s.to_json() for s in self.segments]} if len(self.segments) > 1 else {}),
            **({"versions": list(self.versions)} if self.versions else {}),
            **({"served_by": self.served_by.to_json()} if self.served_by else {}),
        }

    @classmethod
    def from_json(cls, record: Mapping[str, Any] | str | bytes) -> Trajectory:
        """Read back a ``trajectories.jsonl`` record (``to_json``) or its line as read from the file,
        segments included. Fields a trainer adds to the record (reward, advantage) are ignored;
        metadata and tools stay in their JSON form."""
        if isinstance(record, (str, bytes, bytearray)):
            import json

            record = json.loads(record)

        def failure(value: Any) -> Failure | None:
            return Failure(value["kind"], value["message"]) if value else None

        def floats(values: Any) -> tuple:  # "NaN" / "Infinity" as json_float writes them
            return tuple(float(v) if isinstance(v, str) else v for v in values)

        segments = tuple(
            Segment(
                tuple(s["token_ids"]),
                tuple(s["loss_mask"]),
                floats(s["logprobs"]),
                s["prompt_length"],
                s["messages"],
                tuple(Message.from_json(m) for m in s.get("history") or ()),
                tuple(s["tools"]) if s.get("tools") is not None else None,
            )
            for s in record.get("segments") or ()
        )
        return cls(
            index=record["index"],
            task_name=record["task_name"],
            messages=tuple(Message.from_json(m) for m in record["messages"]),
            token_ids=tuple(record["token_ids"]),
            loss_mask=tuple(record["loss_mask"]),
            logprobs=floats(record["logprobs"]),
            prompt_length=record["prompt_length"],
            prompt_messages=record.get("prompt_messages"),
            rewards=floats(record["rewards"]),
            total_reward=floats([record["total_reward"]])[0],
            turns=record["turns"],
            ending=ending_of(record),
            error=failure(record.get("error")),  # type: ignore[arg-type]
            failures=tuple(failure(f) for f in record.get("failures") or ()),
            metadata=record.get("metadata"),
            tools=tuple(record.get("tools") or ()),
            generation_seconds=floats([record.get("generation_seconds", 0.0)])[0],
            environment_seconds=floats([record.get("environment_seconds", 0.0)])[0],
            segments=segments,
            versions=tuple(record.get("versions") or ()),
            retries=record.get("retries", 0),
            served_by=ServedBy.from_json(record.get("served_by")),
        )
