"""The scripted assistant messages ``check_env`` plays, drawn from a seeded ``random.Random``.

Design: values are generated from the tool's JSON schema alone (the subset tools use: ``type``,
``enum``, ``const``, ``anyOf``/``oneOf``, ``nullable``, ``items``, ``properties``/``required``,
``additionalProperties``, ``minimum``/``maximum``), never from the Python signature, so any
environment that offers OpenAI function schemas can be checked. ``scripted_action`` is one turn: a
tool call with valid random arguments, or, when the environment has no tools, a short plain-text
answer. ``invalid_arguments`` breaks one argument, or adds an unexpected one when no argument's
schema can be broken (``Any``, unions). The same RNG state always gives the same messages, which
the determinism rule of ``check_env`` relies on.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Mapping

from ..types import Message, ToolCall

_STRINGS = ("apple", "crane", "hello world", "42", "", "Ünïcode ✓", "left")
_ANSWERS = ("{n}", "The answer is {n}.", "I am not sure.", "{a} + {b} = {n}", "Let me think... {n}")
_NOT_A_VALUE = object()  # no value is invalid for this schema (Any, unions)


def scripted_action(rng: random.Random, turn: int, tools: tuple[str, ...]) -> Message:
    """The scripted assistant message of one turn: a valid tool call, or a plain-text answer."""
    if not tools:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        n = rng.choice((a + b, rng.randint(0, 20)))
        return Message("assistant", rng.choice(_ANSWERS).format(a=a, b=b, n=n))
    function = json.loads(rng.choice(tools))["function"]
    arguments = valid_value(rng, function["parameters"])
    return tool_call_message(ToolCall(function["name"], arguments, id=f"call_{turn}"))


def tool_call_message(call: ToolCall) -> Message:
    """An assistant message carrying ``call``, its content written the way Qwen/Hermes models do."""
    if call.error is not None:
        content = '<tool_call>\n{"name": "oops", "arguments": {\n</tool_call>'
    else:
        payload = {"name": call.name, "arguments": dict(call.arguments)}
        text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=repr)
        content = f"<tool_call>\n{text}\n</tool_call>"
    return Message("assistant", content, tool_calls=(call,))


def valid_value(rng: random.Random, schema: Mapping[str, Any], depth: int = 0) -> Any:
    """A random value that satisfies ``schema`` (the subset of JSON schema tools use)."""
    if "enum" in schema:
        return rng.choice(list(schema["enum"]))
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return valid_value(rng, rng.choice(list(schema[key])), depth + 1)
    if schema.get("nullable") and rng.random() < 0.2:
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "string":
        return rng.choice(_STRINGS)
    if kind in ("integer", "number"):
        low = schema.get("minimum", -3)
        high = schema.get("maximum", low + 13)
        if kind == "integer":
            return rng.randint(math.ceil(low), math.floor(high))
        return round(rng.uniform(low, high), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        length = rng.randint(0, 2) if depth < 3 else 0
        return [valid_value(rng, schema.get("items", {}), depth + 1) for _ in range(length)]
    if kind == "object":
        properties = schema.get("properties")
        if properties is not None:
            required = set(schema.get("required", ()))
            return {
                key: valid_value(rng, sub, depth + 1)
                for key, sub in properties.items()
                if key in required or rng.random() < 0.5
            }
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping) and depth < 3:
            return {"key": valid_value(rng, extra, depth + 1)}
        return {}
    return rng.choice(("text", 1, True))  # no type: anything goes


def _invalid_value(schema: Mapping[str, Any]) -> Any:
    """A value that breaks ``schema``, or ``_NOT_A_VALUE`` when every value fits."""
    if "enum" in schema:
        return "__not_one_of_the_choices__" if "__not_one_of_the_choices__" not in schema["enum"] else 0.5
    kind = schema.get("type")
    if isinstance(kind, list) or "anyOf" in schema or "oneOf" in schema:
        return _NOT_A_VALUE
    return {
        "string": {"not": "a string"},
        "integer": "not a number",
        "number": "not a number",
        "boolean": "maybe",
        "array": 5,
        "object": 5,
        "null": 5,
    }.get(kind, _NOT_A_VALUE)


def invalid_arguments(rng: random.Random, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Valid arguments with one made invalid; an unexpected extra argument when none can be."""
    arguments = valid_value(rng, {**parameters, "type": "object"})
    for key, schema in parameters.get("properties", {}).items():
        value = _invalid_value(schema)
        if value is not _NOT_A_VALUE:
            return {**arguments, key: value}
    return {**arguments, "__unexpected_argument__": 1}
