"""Rules 2 to 4 and 8 of ``check_env`` (``envs/check.py``): the shapes of the values an
``EnvSession`` returns from ``reset``, ``step`` and ``finish``, and the images of its messages.

Design: each rule is a plain function of the value, ``where`` it came from (the call, for the
message) and ``fail``, the checker's way of naming the environment in an ``EnvironmentError_``; the
first broken rule is raised, nothing is collected. ``short`` and ``as_json`` are how the checker
writes values into its messages and transcripts.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Callable, Mapping, Sequence

from ..errors import EnvironmentError_, InvariantError
from ..json_forms import image_bytes
from ..types import Failure, Message
from .base import Reset, Step

#: Builds the error for a broken rule (``_Checker.fail``: it names the environment).
Fail = Callable[[str], EnvironmentError_]


def check_reset(reset: Any, where: str, fail: Fail) -> tuple[str, ...]:
    """Rule 2; the tool schemas as JSON (they ride along in the transcript, so determinism covers
    them too)."""
    if not isinstance(reset, Reset):
        raise fail(f"{where} returned {type(reset).__name__}, expected a Reset")
    if not isinstance(reset.prompt, tuple) or not reset.prompt:
        raise fail(f"{where}: Reset.prompt must be a non-empty tuple of Message, got {reset.prompt!r}")
    for message in reset.prompt:
        if not isinstance(message, Message):
            raise fail(f"{where}: Reset.prompt holds a {type(message).__name__}, expected Message")
    check_stop(reset.stop, where, "Reset.stop", fail)
    if not isinstance(reset.tools, tuple):
        raise fail(f"{where}: Reset.tools must be a tuple of schemas, got {type(reset.tools).__name__}")
    names = [check_tool_schema(schema, where, fail) for schema in reset.tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise fail(f"{where}: tool names must be unique, {duplicates} repeat")
    return tuple(as_json(dict(s)) for s in reset.tools)


def check_tool_schema(schema: Any, where: str, fail: Fail) -> str:
    """A well-formed OpenAI function schema; its name."""
    if not isinstance(schema, Mapping) or schema.get("type") != "function":
        raise fail(f"{where}: a tool schema must be a dict with type 'function', got {short(schema)}")
    function = schema.get("function")
    if not isinstance(function, Mapping):
        raise fail(f"{where}: tool schema {short(schema)} has no 'function' object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise fail(f"{where}: a tool schema has no name: {short(schema)}")
    if not isinstance(function.get("description", ""), str):
        raise fail(f"{where}: tool {name}: description must be a str")
    parameters = function.get("parameters")
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise fail(f"{where}: tool {name}: parameters must be an object schema, got {short(parameters)}")
    properties = parameters.get("properties")
    required = parameters.get("required")
    if not isinstance(properties, Mapping) or not all(isinstance(p, Mapping) for p in properties.values()):
        raise fail(f"{where}: tool {name}: parameters.properties must map names to schemas")
    if not isinstance(required, (list, tuple)) or not all(isinstance(r, str) for r in required):
        raise fail(f"{where}: tool {name}: parameters.required must be a list of names")
    missing = [r for r in required if r not in properties]
    if missing:
        raise fail(f"{where}: tool {name}: required names {missing} that are not in properties")
    return name


def check_step(step: Any, where: str, fail: Fail) -> None:
    """Rule 3."""
    if not isinstance(step, Step):
        raise fail(f"{where} returned {type(step).__name__}, expected a Step")
    if not isinstance(step.messages, tuple) or not all(isinstance(m, Message) for m in step.messages):
        raise fail(f"{where}: Step.messages must be a tuple of Message, got {short(step.messages)}")
    check_reward(step.reward, where, "Step.reward", fail)
    for flag in ("terminated", "truncated"):
        if not isinstance(getattr(step, flag), bool):
            raise fail(f"{where}: Step.{flag} must be a bool, got {getattr(step, flag)!r}")
    check_stop(step.stop, where, "Step.stop", fail)
    if not isinstance(step.failures, tuple) or not all(isinstance(f, Failure) for f in step.failures):
        raise fail(f"{where}: Step.failures must be a tuple of Failure, got {short(step.failures)}")


def check_reward(reward: Any, where: str, what: str, fail: Fail) -> None:
    """A finite float (``Step.reward``, and rule 4's final reward)."""
    if isinstance(reward, bool) or not isinstance(reward, float):
        raise fail(f"{where}: {what} must be a float, got {type(reward).__name__} {reward!r}")
    if not math.isfinite(reward):
        raise fail(f"{where}: {what} must be finite, got {reward!r}")


def check_stop(stop: Any, where: str, what: str, fail: Fail) -> None:
    if stop is not None and (not isinstance(stop, tuple) or not all(isinstance(s, str) for s in stop)):
        raise fail(f"{where}: {what} must be None or a tuple of str, got {stop!r}")


def check_images(messages: Sequence[Message], declared: bool, where: str, fail: Fail) -> None:
    """Rule 8: images only from an environment that declares ``produces_images`` (a text-only
    backend is then refused before a rollout starts), each a PIL image or encoded bytes."""
    for message in messages:
        if message.images and not declared:
            raise fail(
                f"{where}: a {message.role} message carries {len(message.images)} image(s) but the environment "
                "does not declare produces_images=True"
            )
        for image in message.images:
            try:
                image_bytes(image)
            except InvariantError:
                raise fail(
                    f"{where}: an image must be a PIL image or encoded bytes, got {type(image).__name__}"
                ) from None


def image_digests(message: Message) -> tuple[str, ...]:
    """What a transcript keeps of a message's images: a digest of each one's encoded bytes."""
    return tuple(hashlib.sha256(image_bytes(image)[1]).hexdigest()[:16] for image in message.images)


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
