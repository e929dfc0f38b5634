"""Images for ``VLLMBackend``: a vision-language model's prompt as vLLM must receive it, token-exact.

rollforge renders a conversation with images as the model's processor does
(``chat/vision.py``): each image's placeholder is already *expanded* in the prompt ids (Idefics3's
tiles with their row/column tags, Qwen2-VL's run of ``<|image_pad|>``). vLLM (0.32) always expands
placeholders itself: its multimodal processor replaces the placeholder id once per image given in
``multi_modal_data``, even in a ``prompt_token_ids`` prompt, so ids sent expanded would be expanded
a second time (the first ``<image>`` of the first tile would become a whole image, the rest stay
text). ``VLLMImages.prompt`` therefore collapses each image's expansion back to the one
placeholder the chat template wrote, and sends the images beside it
(``{"prompt_token_ids": ..., "multi_modal_data": {"image": [...]}}``).

vLLM's expansion then has to give back exactly the ids the trajectory records: ``check_consumed``
compares the prompt vLLM ran (``RequestOutput.prompt_token_ids``, after its expansion) with the
renderer's, and a difference fails the request (a completion conditioned on other tokens than the
recorded ones must not be trained on). An image whose expansion is not whole in the prompt, or image
tokens that stand for no given image, fail the request before it reaches vLLM. The same holds for a
served vLLM (``OpenAICompatBackend``), which gets the images as ``image_url`` data URLs
(``image_url``: lossless PNG, so the server's pixels are these).

``image_support(model, engine_arguments)`` decides, before the engine starts, whether it will take
images: the model directory must hold a processor with an image processor (``models.load_processor``;
a text model has none, and nothing more is asked), and vLLM must run the model as a multimodal model
with image inputs allowed (the ``ModelConfig`` the engine will be built with). Otherwise it says, in one
line, what is missing.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Sequence

from ..errors import BackendError
from ..images import ImageProcessing, as_pil


class VLLMImages:
    """One vision-language model's prompts for vLLM (see the module docstring)."""

    def __init__(self, processor: Any):
        self.images = ImageProcessing(processor)

    def prompt(self, ids: list[int], images: Sequence[Any]) -> dict[str, Any]:
        """The ``TokensPrompt`` fields of ``ids`` (placeholders expanded) showing ``images`` in order."""
        prompt: dict[str, Any] = {"prompt_token_ids": self.collapsed(ids, images)}
        if images:
            prompt["multi_modal_data"] = {"image": [as_pil(image) for image in images]}
        return prompt

    def collapsed(self, ids: list[int], images: Sequence[Any]) -> list[int]:
        """``ids`` with each image's expansion, in order, replaced by the one placeholder id."""
        placeholder = self.images.placeholder_id
        out: list[int] = []
        start = 0
        for k, image in enumerate(images):
            expansion = list(self.images.expansion(image))
            at = _find(ids, expansion, start)
            if at is None:
                raise BackendError(
                    f"image {k + 1} of {len(images)} is not whole in the prompt: its {len(expansion)} ids (as the "
                    f"processor expands it) do not follow position {start}; render the prompt with the model's "
                    "processor (rollforge.chat.vision.VisionRenderer)"
                )
            out += ids[start:at]
            out.append(placeholder)
            start = at + len(expansion)
        out += ids[start:]
        stray = out.count(placeholder) - len(images)
        if stray:
            raise BackendError(
                f"the prompt holds {stray} image tokens ({self.images.placeholder!r}) outside the expansions of its "
                f"{len(images)} images; every image token must stand for an image given with the request"
            )
        return out

    @staticmethod
    def check_consumed(ids: list[int], consumed: Sequence[int] | None, request_id: str) -> None:
        """Fail ``request_id`` unless vLLM ran exactly ``ids`` (its own expansion of the images)."""
        if consumed is None:
            raise BackendError(f"vLLM request {request_id} returned no prompt ids to check its image expansion")
        consumed = [int(i) for i in consumed]
        if consumed == ids:
            return
        at = next((k for k, (a, b) in enumerate(zip(ids, consumed)) if a != b), min(len(ids), len(consumed)))
        raise BackendError(
            f"vLLM request {request_id}: vLLM expanded the images into a prompt of {len(consumed)} ids, the renderer "
            f"into {len(ids)}, first differing at position {at}; the model's processor and vLLM's expand images "
            "differently, so its completion is not recorded"
        )


def image_support(model: str, engine_arguments: Any) -> tuple[VLLMImages | None, str | None]:
    """``(VLLMImages, None)`` when the engine of ``engine_arguments`` (``vllm.AsyncEngineArgs``) will
    take images for ``model``, else ``(None, what is missing)``."""
    from ..models import load_processor

    processor = load_processor(model)
    if processor is None:
        return None, f"{model} is a text model: it has no processor with an image processor (processor_config.json)"
    try:
        config = engine_arguments.create_model_config()
    except Exception as exc:
        raise BackendError(f"the vLLM engine for {model} failed to start: {type(exc).__name__}: {exc}") from exc
    architecture = "/".join(getattr(config, "architectures", None) or ["?"])
    if not config.is_multimodal_model:
        return None, f"vLLM runs {model} ({architecture}) as a text-only model, not a vision-language model"
    if config.multimodal_config.get_limit_per_prompt("image") == 0:
        return None, f"vLLM runs {model} ({architecture}) with image inputs switched off (limit_mm_per_prompt)"
    return VLLMImages(processor), None


def image_url(image: Any) -> str:
    """``image`` (PIL or encoded bytes) as a ``data:image/png;base64,...`` URL."""
    buffer = io.BytesIO()
    as_pil(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _find(ids: list[int], part: list[int], start: int) -> int | None:
    """The first position from ``start`` where ``part`` occurs in ``ids``, or None."""
    k = start
    while True:
        try:
            k = ids.index(part[0], k)
        except ValueError:
            return None
        if ids[k : k + len(part)] == part:
            return k
        k += 1
