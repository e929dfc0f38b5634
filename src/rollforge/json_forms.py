"""The strict-JSON forms of the values trajectories hold, as ``trajectories.jsonl`` writes them.

Strict JSON has no NaN or infinities: a non-finite float is written as a string ``float()`` reads
back (``json_float``); any other value becomes JSON data or, failing that, its ``repr``
(``jsonable``); an image is written losslessly as base64 with its MIME type (``image_json``).
``types.py`` writes with these; this module imports only ``errors``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from .errors import InvariantError


def json_float(value: float | None) -> float | str | None:
    """Strict JSON has no NaN or infinities: those are written as the strings ``"NaN"``,
    ``"Infinity"`` and ``"-Infinity"``, which ``float()`` reads back (``null`` would be ambiguous:
    a null logprob marks a token the policy did not generate)."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: mappings and sequences recursively, non-finite floats as
    ``json_float`` writes them, anything else that JSON cannot hold as its ``repr``."""
    if isinstance(value, float):
        return json_float(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)


def is_image(value: Any) -> bool:
    """Whether ``value`` is a PIL image, or looks like one (``save``, ``size`` and ``mode``): PIL
    itself is never imported."""
    return callable(getattr(value, "save", None)) and hasattr(value, "size") and hasattr(value, "mode")


def image_bytes(image: Any) -> tuple[str, bytes]:
    """An image of ``Message.images`` as (MIME type, encoded bytes): encoded bytes as they are, a
    PIL image (``is_image``) as PNG."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        mime = next((m for magic, m in _IMAGE_MAGIC if data.startswith(magic)), "application/octet-stream")
        return mime, data
    if is_image(image):
        import io

        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return "image/png", buffer.getvalue()
    raise InvariantError(f"an image must be encoded bytes or a PIL image, got {type(image).__name__}")


def image_json(image: Any) -> dict[str, str]:
    """The trajectory-JSON form of an image: ``{"type": "image", "mime", "base64"}``, lossless."""
    import base64

    mime, data = image_bytes(image)
    return {"type": "image", "mime": mime, "base64": base64.b64encode(data).decode("ascii")}


_IMAGE_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"), (b"RIFF", "image/webp"))
