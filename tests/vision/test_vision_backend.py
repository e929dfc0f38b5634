"""``HFVisionBackend``: the images reach the forward pass, the logprobs are the model's own, and a
prompt whose image tokens do not match its images is refused."""

from __future__ import annotations

import pytest
import torch

from rollforge.backends.base import SamplingParams
from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.chat.vision import VisionRenderer
from rollforge.errors import BackendError
from rollforge.testing.vlm import make_tiny_vlm
from rollforge.types import Message

from vision_helpers import picture


def _prompt(renderer, images):
    return renderer.prompt_ids([Message("user", "What do you see?", images=tuple(images))]) + renderer.generation_prompt


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_logprobs_are_those_of_a_forward_pass_with_the_images(vlm, temperature):
    _, model, processor = vlm
    renderer = VisionRenderer(processor)
    images = [picture(0), picture(1, (100, 90))]
    ids = _prompt(renderer, images)
    async with HFVisionBackend(model, processor) as backend:
        completion = await backend.generate(
            ids, SamplingParams(max_new_tokens=8, temperature=temperature, seed=3), images=images
        )
    whole = ids + list(completion.token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([whole]), **renderer.images.inputs(whole, images)).logits[0]
    expected = logits.float().log_softmax(-1)[len(ids) - 1 : -1].gather(1, torch.tensor(completion.token_ids)[:, None])
    assert len(completion.token_ids) >= 1
    assert torch.allclose(expected.squeeze(1), torch.tensor(completion.logprobs), atol=1e-4)


async def test_the_logits_change_when_the_image_changes(vlm):
    _, model, processor = vlm
    renderer = VisionRenderer(processor)
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=5)
    async with HFVisionBackend(model, processor) as backend:
        red = await backend.generate(_prompt(renderer, [picture(0)]), params, images=[picture(0)])
        again = await backend.generate(_prompt(renderer, [picture(0)]), params, images=[picture(0)])
        blue = await backend.generate(_prompt(renderer, [picture(2)]), params, images=[picture(2)])
    assert red == again  # same picture, same seed: the same completion
    assert red.logprobs[0] != pytest.approx(blue.logprobs[0], abs=1e-5) or red.token_ids != blue.token_ids


async def test_a_prompt_whose_image_tokens_do_not_match_its_images_is_refused(vlm):
    _, model, processor = vlm
    renderer = VisionRenderer(processor)
    images = [picture(0), picture(1)]
    ids = _prompt(renderer, images)
    held = ids.count(renderer.images.placeholder_id)
    async with HFVisionBackend(model, processor) as backend:
        with pytest.raises(
            BackendError, match=rf"the prompt holds {held} image tokens but its 1 images take {held // 2}"
        ):
            await backend.generate(ids, SamplingParams(max_new_tokens=2), images=images[:1])
        with pytest.raises(BackendError, match="its 3 images take"):
            await backend.generate(ids, SamplingParams(max_new_tokens=2), images=[*images, picture(3)])


async def test_image_placeholders_are_never_sampled():
    """The placeholder made the model's favourite token: the backend samples the runner-up, and
    records the token's raw logprob (below the placeholder's)."""
    model, processor = make_tiny_vlm("qwen2_vl", seed=1)
    renderer = VisionRenderer(processor)
    ids = _prompt(renderer, [picture(0)])
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    async with HFVisionBackend(model, processor) as backend:
        favourite = (await backend.generate(ids, params, images=[picture(0)])).token_ids[0]
        head = model.get_output_embeddings().weight
        placeholder = renderer.images.placeholder_id
        with torch.no_grad():  # swap the favourite's output row with the placeholder's
            head[[favourite, placeholder]] = head[[placeholder, favourite]]
        completion = await backend.generate(ids, params, images=[picture(0)])
    assert completion.token_ids[0] not in renderer.images.reserved_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), **renderer.images.inputs(ids, [picture(0)])).logits[0, -1]
    assert int(logits.argmax()) == placeholder
    assert completion.logprobs[0] == pytest.approx(float(logits.log_softmax(-1)[completion.token_ids[0]]), abs=1e-5)


def test_a_processor_without_an_image_processor_is_refused(vlm):
    _, model, processor = vlm
    with pytest.raises(BackendError, match="needs the model's processor with an image processor"):
        HFVisionBackend(model, processor.tokenizer)


async def test_a_prompt_over_the_positions_is_context_exceeded(vlm):
    from rollforge.errors import ContextExceeded

    _, model, processor = vlm
    longest = model.config.get_text_config(decoder=True).max_position_embeddings
    async with HFVisionBackend(model, processor) as backend:
        with pytest.raises(ContextExceeded, match=f"at most {longest} positions"):
            await backend.generate([1] * longest, SamplingParams(max_new_tokens=2))
