"""From an OpenEnv server's ``/schema`` to what a model sees: one tool, and observations as text.

Design. An OpenEnv environment takes one typed action per step (a pydantic model). rollforge offers
that action to the model as a single tool, in the OpenAI function format:

- name: ``tool_name`` if given, else the action class's title in snake case without the
  ``Action`` suffix (``MoveAction`` -> ``move``; a bare ``Action`` -> ``act``);
- parameters: the action's properties except OpenEnv's bookkeeping ``metadata`` field, with
  ``$ref``s into ``$defs`` inlined and pydantic's ``title`` noise removed, so that the model sees
  plain JSON schema (enums, types, descriptions and defaults are kept).

Arguments are not validated here: the server validates every action with its own pydantic model
and answers ``VALIDATION_ERROR``, which the client reports to the model as a bad tool call.

Observations: the observation's fields except ``metadata`` (and ``done``/``reward``, which the
wire format carries beside it) are rendered as text. A single string field is shown as it is;
several fields are shown one per line as ``name: value`` (non-strings as JSON); empty values are
left out. Image fields carry images instead of text: fields the observation schema marks as
images (``contentMediaType: image/...``, or ``contentEncoding: base64``) and fields named in
``image_fields``. Their values are base64 strings (``data:`` URLs accepted) or lists of them;
they become PNG/JPEG bytes in ``Message.images``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
from typing import Any, Iterable, Mapping

from ...errors import EnvironmentError_

#: Fields of OpenEnv's base Action/Observation that are bookkeeping, never shown to the model.
_HIDDEN_ACTION_FIELDS = frozenset({"metadata"})
_HIDDEN_OBSERVATION_FIELDS = frozenset({"metadata", "done", "reward"})


def tool_name_from_title(title: str | None) -> str:
    """``MoveAction`` -> ``move``, ``CodeExecAction`` -> ``code_exec``, ``Action`` -> ``act``."""
    name = (title or "").strip()
    if name.endswith("Action"):
        name = name[: -len("Action")]
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    name = re.sub(r"[^a-z0-9_]+", "_", name).strip("_")
    return name or "act"


def _inline(schema: Any, defs: Mapping[str, Any], depth: int = 0) -> Any:
    """``schema`` with ``$ref: #/$defs/X`` replaced by the definition and ``title`` keys dropped."""
    if depth > 32:
        raise EnvironmentError_("the OpenEnv action schema nests $refs more than 32 deep (recursive?)")
    if isinstance(schema, list):
        return [_inline(item, defs, depth + 1) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref[len("#/$defs/") :])
        if target is None:
            raise EnvironmentError_(f"the OpenEnv action schema refers to {ref}, which it does not define")
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _inline(merged, defs, depth + 1)
    return {k: _inline(v, defs, depth + 1) for k, v in schema.items() if k not in ("title", "$defs")}


def action_tool(
    action_schema: Mapping[str, Any], *, name: str | None = None, description: str | None = None
) -> dict[str, Any]:
    """The OpenAI function schema offering the action described by ``action_schema``."""
    if not isinstance(action_schema, Mapping) or not isinstance(action_schema.get("properties", {}), Mapping):
        raise EnvironmentError_(f"the OpenEnv server's action schema is not an object schema: {action_schema!r}")
    defs = action_schema.get("$defs", {})
    properties = {
        key: _inline(value, defs)
        for key, value in action_schema.get("properties", {}).items()
        if key not in _HIDDEN_ACTION_FIELDS
    }
    required = [key for key in action_schema.get("required", []) if key in properties]
    title = action_schema.get("title")
    text = (
        description or action_schema.get("description") or f"Take one action ({title or 'Action'}) in the environment."
    )
    return {
        "type": "function",
        "function": {
            "name": name or tool_name_from_title(title),
            "description": " ".join(str(text).split()),
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def image_fields(observation_schema: Mapping[str, Any] | None, declared: Iterable[str] = ()) -> frozenset[str]:
    """Observation fields that hold images: ``declared`` plus those the schema marks as images."""
    found = set(declared)
    defs = (observation_schema or {}).get("$defs", {})
    for key, value in ((observation_schema or {}).get("properties") or {}).items():
        if _marks_image(_inline(value, defs)):
            found.add(key)
    return frozenset(found)


def _marks_image(schema: Any) -> bool:
    if isinstance(schema, list):
        return any(_marks_image(s) for s in schema)
    if not isinstance(schema, Mapping):
        return False
    media = str(schema.get("contentMediaType", ""))
    if media.startswith("image/") or schema.get("contentEncoding") == "base64":
        return True
    return any(_marks_image(schema.get(k)) for k in ("items", "anyOf", "oneOf", "allOf"))


def decode_image(value: Any, field: str) -> bytes:
    """A base64 string (or ``data:image/...;base64,`` URL) -> the encoded image bytes."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise EnvironmentError_(
            f"observation field {field!r} should hold a base64-encoded image, got {type(value).__name__}"
        )
    data = value.split(",", 1)[1] if value.startswith("data:") else value
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise EnvironmentError_(f"observation field {field!r} is not valid base64 image data: {exc}") from None


def render_observation(observation: Mapping[str, Any], images_in: frozenset[str]) -> tuple[str, tuple[bytes, ...]]:
    """An observation dict as (text for the model, images)."""
    shown: dict[str, Any] = {}
    images: list[bytes] = []
    for key, value in observation.items():
        if key in _HIDDEN_OBSERVATION_FIELDS or value is None or value == "" or value == [] or value == {}:
            continue
        if key in images_in:
            for item in value if isinstance(value, list) else [value]:
                images.append(decode_image(item, key))
            continue
        shown[key] = value
    if len(shown) == 1 and isinstance(next(iter(shown.values())), str):
        return next(iter(shown.values())), tuple(images)
    lines = [
        f"{key}: {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
        for key, value in shown.items()
    ]
    return "\n".join(lines), tuple(images)


def jsonable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row columns that can travel as JSON reset parameters (``prompt`` excluded)."""
    out = {}
    for key, value in row.items():
        if key == "prompt":
            continue
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue
        out[key] = copy.deepcopy(value)
    return out
