"""Chat rendering for vision-language models: the images of every message, token-exact.

``VisionRenderer`` is a ``ChatRenderer`` over a processor's tokenizer whose messages may carry
images (``Message.images``: a user prompt's, a tool result's). Two things change, nothing else:

- ``chat(message)``: a message with images is given to the template as content blocks, one
  ``{"type": "image"}`` per image, then ``{"type": "text", "text": <escaped content>}`` (images
  first, as the Qwen-VL and SmolVLM model cards write them). The template writes its placeholder
  for each block (``<|vision_start|><|image_pad|><|vision_end|>``, ``<image>``).
- Every rendering of messages (``conversation_ids``, ``delta_ids``, and ``prompt_ids``, which
  renders conversations with images whole) then replaces the i-th placeholder id by the i-th
  image's expansion, exactly the ids the processor puts there (``images.ImageProcessing``). The
  placeholder and its expansion are special tokens at both ends, so splicing ids equals the
  processor's own tokenizing of the expanded text; the tests compare both on whole conversations.

A rendering whose placeholders do not match its images one to one (a template that drops image
blocks for some role) is a ``TemplateError`` naming both counts. Image tokens sit in what the
episode appends as context, so they carry loss mask 0 like any observation. ``renderer_for``
picks this renderer for a processor that has an image processor, the plain one otherwise.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import TemplateError
from ..images import ImageProcessing
from ..types import Message
from .families import Family
from .render import ChatRenderer


class VisionRenderer(ChatRenderer):
    """A ``ChatRenderer`` for ``processor``'s model that renders images (see the module docstring)."""

    def __init__(self, processor: Any, family: str | Family | None = None, *, keep_reasoning: bool = False):
        tokenizer = processor.tokenizer
        if getattr(tokenizer, "chat_template", None) is None and isinstance(processor.chat_template, str):
            tokenizer.chat_template = processor.chat_template  # the checkpoint keeps it beside the tokenizer
        super().__init__(tokenizer, family, keep_reasoning=keep_reasoning)
        self.processor = processor
        self.images = ImageProcessing(processor)

    def chat(self, message: Message) -> dict[str, Any]:
        out = super().chat(message)
        if message.images:
            blocks: list[dict[str, Any]] = [{"type": "image"} for _ in message.images]
            out["content"] = [*blocks, {"type": "text", "text": out["content"]}]
        return out

    def conversation_ids(
        self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = (), add_generation_prompt: bool = False
    ) -> list[int]:
        return self.expanded(super().conversation_ids(messages, tools, add_generation_prompt), messages)

    def delta_ids(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = ()) -> list[int]:
        return self.expanded(super().delta_ids(messages, tools), messages)

    def expanded(self, ids: list[int], messages: Sequence[Message]) -> list[int]:
        """``ids`` (a rendering of ``messages``) with each image placeholder replaced by its image's
        expansion, in order."""
        images = [image for message in messages for image in message.images]
        at = [k for k, token in enumerate(ids) if token == self.images.placeholder_id]
        if len(at) != len(images):
            raise TemplateError(
                f"the chat template wrote {len(at)} image placeholders ({self.images.placeholder!r}) for "
                f"{len(images)} images of roles {[m.role for m in messages if m.images]}; expected one per image"
            )
        if not images:
            return ids
        out: list[int] = []
        start = 0
        for k, image in zip(at, images):
            out += ids[start:k]
            out += self.images.expansion(image)
            start = k + 1
        return out + ids[start:]


def renderer_for(
    tokenizer_or_processor: Any, family: str | Family | None = None, *, keep_reasoning: bool = False
) -> ChatRenderer:
    """A ``VisionRenderer`` for a processor with an image processor, else a ``ChatRenderer`` (of the
    processor's tokenizer when given a text-only processor)."""
    if getattr(tokenizer_or_processor, "image_processor", None) is not None:
        return VisionRenderer(tokenizer_or_processor, family, keep_reasoning=keep_reasoning)
    given = tokenizer_or_processor
    tokenizer = given if callable(getattr(given, "encode", None)) else given.tokenizer  # a processor has none
    return ChatRenderer(tokenizer, family, keep_reasoning=keep_reasoning)
