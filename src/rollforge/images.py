"""What a vision-language model's processor makes of images, in one place for the three parts that
need it: the chat renderer (how many tokens stand for an image), the generation backend and the
update (the pixel inputs of a forward pass).

``ImageProcessing`` wraps a transformers processor and uses only what every image-text processor
has: ``image_token`` / ``image_token_id`` (the placeholder the chat template writes once per
image), ``model_input_names``, and ``__call__`` itself. Two facts are taken from it:

- ``expansion(image)``: the ids the processor puts in place of one image's placeholder, read from
  the processor's own output for that placeholder alone (``add_special_tokens=False``): Qwen2-VL's
  run of ``<|image_pad|>`` (one per merged patch), Idefics3's tiles with their row/column tags.
  Expansions do not depend on the other images of a conversation, so they are computed once per
  image object (cached by identity, the object kept alive so that its id is not reused).
- ``inputs(ids, images)``: the keyword inputs besides ``input_ids`` of one forward pass over
  ``ids`` showing ``images`` in order: the processor's output for those images (``pixel_values``
  and ``image_grid_thw``, or ``pixel_values`` and ``pixel_attention_mask``, ...) and, for
  processors that return it, ``mm_token_type_ids`` of ``ids`` (Qwen's 3-D RoPE needs it).

``whole_images(ids, images)`` says how many of ``images`` the ids show whole, in order, and how
many placeholder tokens are left after them (an observation cut at ``max_seq_len`` may cut an
image: its tokens are then not a whole image). Images are PIL images or encoded bytes
(``Message.images``); bytes are decoded with PIL. No error is raised here: callers say what a
mismatch means at their boundary (a template error, a failed request, a row the update pads).
"""

from __future__ import annotations

import io
from typing import Any, Sequence

from .errors import require
from .json_forms import is_image

#: Text-side outputs of a processor: the caller has its own ids.
_TEXT_KEYS = frozenset({"input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids"})
_CACHE_LIMIT = 1024


def as_pil(image: Any) -> Any:
    """``image`` as a PIL image: a PIL image as it is, encoded bytes decoded."""
    if is_image(image):
        return image
    pil = require("PIL.Image", extra="vision", feature="decoding images for a vision-language model")
    return pil.open(io.BytesIO(bytes(image)))


class ImageProcessing:
    """One processor's view of images (see the module docstring)."""

    def __init__(self, processor: Any):
        self.processor = processor
        #: The placeholder the chat template writes once per image, as text and as its id.
        self.placeholder: str = processor.image_token
        self.placeholder_id: int = int(processor.image_token_id)
        #: Ids only the processor places (image and video placeholders): never to be generated.
        self.reserved_ids: frozenset[int] = frozenset(
            int(i)
            for i in (self.placeholder_id, getattr(processor, "video_token_id", None))
            if isinstance(i, int) and i >= 0
        )
        names = list(getattr(processor, "model_input_names", ()))
        self._token_types = "mm_token_type_ids" in names
        self._kept = frozenset(names) - _TEXT_KEYS
        self._expansions: dict[int, tuple[Any, tuple[int, ...]]] = {}

    def expansion(self, image: Any) -> tuple[int, ...]:
        """The ids that stand for ``image`` where the template wrote its placeholder."""
        hit = self._expansions.get(id(image))
        if hit is None:
            if len(self._expansions) >= _CACHE_LIMIT:
                self._expansions.clear()
            out = self.processor(text=[self.placeholder], images=[[as_pil(image)]], add_special_tokens=False)
            hit = self._expansions[id(image)] = (image, tuple(int(i) for i in out["input_ids"][0]))
        return hit[1]

    def tokens(self, image: Any) -> int:
        """How many placeholder ids ``image``'s expansion holds."""
        return self.expansion(image).count(self.placeholder_id)

    def whole_images(self, ids: Sequence[int], images: Sequence[Any]) -> tuple[int, int]:
        """(how many of ``images``, in order, ``ids`` show whole; placeholder ids after those)."""
        left = list(ids).count(self.placeholder_id)
        shown = 0
        for image in images:
            need = self.tokens(image)
            if need > left:
                break
            left -= need
            shown += 1
        return shown, left

    def inputs(self, ids: Sequence[int], images: Sequence[Any]) -> dict[str, Any]:
        """The forward pass's inputs for ``images`` (all shown whole in ``ids``), each with a batch
        of one row where the processor batches; ``{}`` without images."""
        if not images:
            return {}
        import torch

        out = self.processor(
            text=[self.placeholder * len(images)],
            images=[[as_pil(image) for image in images]],
            add_special_tokens=False,
            return_tensors="pt",
        )
        inputs = {key: value for key, value in out.items() if key in self._kept}
        if self._token_types:
            inputs["mm_token_type_ids"] = torch.tensor(self.processor.create_mm_token_type_ids([list(ids)]))
        return inputs
