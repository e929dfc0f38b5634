"""Tiny, offline, seeded vision-language models of real architectures, for tests and benchmarks.

``make_tiny_vlm(family)`` returns ``(model, processor)``: a randomly initialised model of a shipped
transformers architecture and that architecture's own processor (its real image processor, which
resizes, tiles and patches the pixels, and its real placeholder expansion), around the tiny text
tokenizer of ``tiny.py`` with the family's image tokens added as special tokens. Nothing is
downloaded; building one takes about a second once transformers is imported, and the same seed
gives the same weights.

Families (``VLM_FAMILIES``):

- ``qwen2_vl``: ``Qwen2VLForConditionalGeneration`` (the Qwen2-VL / Qwen2.5-VL design: a vision
  tower whose patches are merged 2x2, one ``<|image_pad|>`` per merged patch, 3-D multimodal RoPE)
  with ``Qwen2VLProcessor`` over the PIL ``Qwen2VLImageProcessorPil``. transformers builds that
  processor only with torchvision installed (for its video processor); without it the processor is
  the same class with the video processor left out (``ImageOnlyQwen2VLProcessor``), which changes
  nothing for images. Its chat template is Qwen2-VL-Instruct's.
- ``idefics3``: ``Idefics3ForConditionalGeneration`` (SmolVLM-Instruct's architecture: a SigLIP
  tower, pixel shuffle, images split into tiles plus a global view, each tile written as
  ``<fake_token_around_image><row_r_col_c><image>...``) with ``Idefics3Processor`` over the PIL
  ``Idefics3ImageProcessorPil``. SmolVLM's own chat template reads contents only as lists of blocks,
  which rollforge's text messages are not, so the tiny model's template is ChatML with ``<image>``
  for each image block.

Images are small (tens of pixels a side) so that an image is a few dozen tokens.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .tiny import make_tokenizer

#: The families ``make_tiny_vlm`` builds.
VLM_FAMILIES = ("qwen2_vl", "idefics3")

#: Qwen2-VL-Instruct's chat template: ChatML, an image block as
#: ``<|vision_start|><|image_pad|><|vision_end|>``, a default system message.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: ChatML with ``<image>`` for each image block (the tiny Idefics3's template, see the docstring).
IDEFICS3_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<image>{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: The tiny decoder's sizes (both families; ``bench gpu --quick``'s vision section too).
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)

#: The tiny Idefics3's SigLIP tower and image processing: tiles of 56 x 56 pixels, 16 patches of 14,
#: shuffled 2x2 (``IDEFICS3_SCALE``) into 4 tokens; images up to 112 pixels a side
#: (``IDEFICS3_EDGES``: longest edge, tile) are split into up to 2 x 2 tiles plus the global view.
IDEFICS3_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=56,
    patch_size=14,
)
IDEFICS3_SCALE = 2
IDEFICS3_EDGES = (112, 56)

_QWEN_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_IDEFICS3_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
)


def make_tiny_vlm(family: str = "qwen2_vl", seed: int = 0) -> tuple[Any, Any]:
    """``(model, processor)`` of a tiny random model of ``family`` (one of ``VLM_FAMILIES``), in
    eval mode, float32, on the CPU."""
    if family == "qwen2_vl":
        return _qwen2_vl(seed)
    if family == "idefics3":
        return _idefics3(seed)
    raise ConfigError(f"unknown tiny VLM family {family!r}; expected one of {', '.join(VLM_FAMILIES)}")


def save_tiny_vlm(directory: Any, family: str = "qwen2_vl", seed: int = 0) -> Any:
    """Write ``make_tiny_vlm(family, seed)`` to ``directory`` (model and processor, loadable with
    ``AutoModelForImageTextToText`` / ``AutoProcessor``, the Qwen2-VL processor only with torchvision)."""
    from pathlib import Path

    directory = Path(directory)
    model, processor = make_tiny_vlm(family, seed)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def _tokenizer(extra: tuple[str, ...], template: str) -> Any:
    tokenizer = make_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(extra)})
    tokenizer.chat_template = template
    return tokenizer


def _text_config(tokenizer: Any) -> dict[str, Any]:
    """The two-layer decoder of ``tiny.py`` (peaked logits: ``initializer_range`` 0.2)."""
    return dict(
        vocab_size=len(tokenizer),
        **TINY_TEXT,
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _seeded(build: Any, config: Any, tokenizer: Any, seed: int) -> Any:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def _qwen2_vl(seed: int) -> tuple[Any, Any]:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _tokenizer(_QWEN_TOKENS, QWEN2_VL_TEMPLATE)
    ids = dict(zip(_QWEN_TOKENS, tokenizer.convert_tokens_to_ids(list(_QWEN_TOKENS))))
    # 28 x 28 pixels per merged patch: an image of 28k x 28m pixels is k * m image tokens (4 to 16 here)
    images = Qwen2VLImageProcessorPil(min_pixels=4 * 28 * 28, max_pixels=16 * 28 * 28, merge_size=2)
    processor = _qwen2_vl_processor(images, tokenizer)
    text = {**_text_config(tokenizer), "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    text["rope_parameters"]["mrope_section"] = [2, 3, 3]  # halves of the 16-dim heads: time, height, width
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, spatial_merge_size=2),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    return _seeded(Qwen2VLForConditionalGeneration, config, tokenizer, seed), processor


def _qwen2_vl_processor(images: Any, tokenizer: Any) -> Any:
    """Qwen2-VL's processor; without torchvision, the same class with no video processor."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    try:
        import torchvision  # noqa: F401
    except ImportError:

        class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
            """``Qwen2VLProcessor`` without its video processor (which needs torchvision)."""

            def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None):
                self.image_token = "<|image_pad|>"
                self.video_token = "<|video_pad|>"
                self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
                self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
                ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

        return ImageOnlyQwen2VLProcessor(images, tokenizer, chat_template=tokenizer.chat_template)
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    return Qwen2VLProcessor(images, tokenizer, Qwen2VLVideoProcessor(), chat_template=tokenizer.chat_template)


def _idefics3(seed: int) -> tuple[Any, Any]:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = _tokenizer(_IDEFICS3_TOKENS, IDEFICS3_TEMPLATE)
    longest, tile = IDEFICS3_EDGES
    images = Idefics3ImageProcessorPil(size={"longest_edge": longest}, max_image_size={"longest_edge": tile})
    tokens = (IDEFICS3_VISION["image_size"] // IDEFICS3_VISION["patch_size"] // IDEFICS3_SCALE) ** 2
    processor = Idefics3Processor(images, tokenizer, image_seq_len=tokens, chat_template=tokenizer.chat_template)
    config = Idefics3Config(
        text_config={**_text_config(tokenizer), "model_type": "llama"},
        vision_config=IDEFICS3_VISION,
        scale_factor=IDEFICS3_SCALE,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    return _seeded(Idefics3ForConditionalGeneration, config, tokenizer, seed), processor
