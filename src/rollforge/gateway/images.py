"""Image content parts on the gateway's wire, no I/O: ``data:`` URLs in, encoded image bytes out.

An agent program shows the model a picture with a chat-completions content part,
``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (``responses.py``
turns the Responses API's ``input_image`` parts into these). ``message_content`` reads a
message's content into its text (the text parts joined, as before) and its images (each image
part's decoded bytes, in order). The images become the message's ``Message.images``, the form
environments use, so the vision renderer expands them (``chat/vision.py``: images before the
text), the backend gets them and the trajectory keeps them byte for byte.

The policy, every refusal a 400 naming the part:

- The gateway fetches nothing: an image is a base64 ``data:`` URL. A remote ``http(s)`` URL (or
  any other scheme) is refused naming the URL, as is base64 that does not decode or bytes that are
  not a PNG, JPEG, GIF or WebP image (``json_forms.image_bytes`` tells them by their first bytes).
- Images come on ``user`` and ``tool`` messages, the ones that carry observations; ``system``
  and ``assistant`` messages take text parts only.
- Whether the policy takes images at all is the session's check (``Backend.accepts_images``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from ..errors import WireError
from ..json_forms import image_bytes

#: Roles whose messages may carry images.
IMAGE_ROLES = ("user", "tool")
_UNKNOWN = "application/octet-stream"


def message_content(value: Any, where: str, role: str) -> tuple[str, tuple[bytes, ...]]:
    """A message's ``content`` (a string, null or a list of parts) as (its text, its images)."""
    if value is None or isinstance(value, str):
        return value or "", ()
    if not isinstance(value, list):
        raise WireError(
            f"{where}.content must be a string, null or a list of content parts, got {type(value).__name__}",
            f"{where}.content",
        )
    texts: list[str] = []
    images: list[bytes] = []
    for k, part in enumerate(value):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url" and role in IMAGE_ROLES:
            images.append(_image(part, f"{where}.content[{k}]"))
        else:
            takes = "text and image_url parts" if role in IMAGE_ROLES else "text parts only"
            raise WireError(
                f"{where}.content[{k}] is of type {kind!r}; a {role} message takes {takes}", f"{where}.content"
            )
    return "".join(texts), tuple(images)


def image_url_part(url: Any, where: str) -> dict[str, Any]:
    """The chat ``image_url`` part of an image URL another wire format sent, checked there (a
    ``data:`` URL of an image), so that a refusal names the part as that format's request does."""
    _decoded(url, where)
    return {"type": "image_url", "image_url": {"url": url}}


def check_data_url(url: Any, where: str) -> None:
    """Refuse anything but a base64 ``data:`` URL, naming ``url``: the gateway fetches nothing."""
    if not isinstance(url, str):
        raise WireError(f"{where} must hold the image's URL as a string, got {type(url).__name__}", where)
    head = url.split(",", 1)[0]
    if not head.startswith("data:"):
        raise WireError(
            f"{where}: the image URL {_shown(url)!r} is not fetched: the gateway accepts only data: URLs "
            "(data:image/png;base64,...)",
            where,
            code="image_url_not_supported",
        )
    if "," not in url or not head.endswith(";base64"):
        raise WireError(f"{where}: the data: URL {_shown(url)!r} is not base64 (data:image/png;base64,...)", where)


def _image(part: Mapping[str, Any], where: str) -> bytes:
    """The encoded bytes of one ``image_url`` part (``image_url`` an object with ``url``, or the URL itself)."""
    image_url = part.get("image_url")
    return _decoded(image_url.get("url") if isinstance(image_url, Mapping) else image_url, f"{where}.image_url.url")


def _decoded(url: Any, where: str) -> bytes:
    """The image bytes of a base64 ``data:`` URL, refused naming ``where`` if it is anything else."""
    check_data_url(url, where)
    try:
        data = base64.b64decode(url.split(",", 1)[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WireError(f"{where}: the data: URL's base64 does not decode ({exc})", where) from None
    if image_bytes(data)[0] == _UNKNOWN:
        raise WireError(
            f"{where}: the data: URL holds {len(data)} bytes that are not a PNG, JPEG, GIF or WebP image", where
        )
    return data


def _shown(url: str, limit: int = 80) -> str:
    return url if len(url) <= limit else url[:limit] + "..."
