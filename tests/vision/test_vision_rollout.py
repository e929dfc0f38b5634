"""Episodes with images: every turn's request carries every image so far, the trajectory holds the
images and the tokens that stand for them (mask 0), token-exact, and the update's logprobs are
the backend's."""

from __future__ import annotations

import pytest
import torch

from rollforge.backends.base import BackendWrapper
from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.vision import VisionRenderer
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.recipes.sft_data import expert_backend
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact, make_tokenizer
from rollforge.train.update import collate, sequences
from rollforge.train.vision import batch_logprobs

from vision_helpers import looks_env, looks_samples


class SeenImages(BackendWrapper):
    """Keeps how many images each request carried."""

    def __init__(self, inner, accepts_images=True):
        super().__init__(inner)
        self.counts: list[int] = []
        self._accepts = accepts_images

    @property
    def accepts_images(self):
        return self._accepts

    async def generate(self, prompt_ids, params, images=()):
        self.counts.append(len(images))
        if self.inner.accepts_images:
            return await self.inner.generate(prompt_ids, params, images=images)
        return await self.inner.generate(prompt_ids, params)  # a script that reads the messages itself


@pytest.fixture(scope="module")
def rolled(vlm):
    import asyncio

    _, model, processor = vlm
    renderer = VisionRenderer(processor)

    async def run():
        async with HFVisionBackend(model, processor) as inner:
            recording = RecordingBackend(inner)
            seen = SeenImages(recording)
            config = RolloutConfig(max_new_tokens=5, max_turns=4, seed=1)
            result = await arollout(looks_samples(range(3)), {"looks": looks_env(3)}, seen, renderer, config)
            return result.trajectories, recording.calls, seen.counts

    trajectories, calls, counts = asyncio.run(run())
    return model, renderer, trajectories, calls, counts


def test_every_turn_sees_every_image_so_far_token_exact(rolled):
    _, renderer, trajectories, calls, counts = rolled
    assert assert_token_exact(trajectories, calls, renderer) == 9  # three turns of three episodes
    assert sorted(counts) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    for t in trajectories:
        assert [len(m.images) for m in t.messages if m.role != "assistant"] == [1, 1, 1]
        assert [m.role for m in t.messages if m.images] == ["user", "tool", "tool"]


def test_image_tokens_are_context_not_policy_tokens(rolled):
    _, renderer, trajectories, _, _ = rolled
    for t in trajectories:
        image = [bit for token, bit in zip(t.token_ids, t.loss_mask) if token == renderer.images.placeholder_id]
        expected = sum(renderer.images.tokens(i) for m in t.messages for i in m.images)
        assert len(image) == expected > 0 and set(image) == {0}


def test_the_updates_logprobs_are_the_backends(rolled):
    model, renderer, trajectories, _, _ = rolled
    rows, owners = sequences(trajectories, renderer.images)
    assert owners == [0, 1, 2] and all(len(row.images.images) == 3 for row in rows)
    ids, attention, old, weights = collate(rows, [row.mask for row in rows], 0, torch.device("cpu"))
    with torch.no_grad():
        logprobs = batch_logprobs(model, rows, ids, attention, weights != 0)
    policy = weights != 0
    assert policy.sum() == sum(sum(t.loss_mask) for t in trajectories) > 0
    assert torch.allclose(logprobs[policy], old[policy], atol=1e-4)
    assert logprobs[~policy].abs().sum() == 0


def test_without_the_images_the_update_would_not_see_what_the_policy_saw(rolled):
    """The same rows forwarded without their pictures (image tokens as plain embeddings) score the
    policy's tokens differently: the pictures matter to the logprobs."""
    from dataclasses import replace

    model, renderer, trajectories, _, _ = rolled
    rows = [replace(row, images=None) for row in sequences(trajectories, renderer.images)[0]]
    ids, attention, old, weights = collate(rows, [row.mask for row in rows], 0, torch.device("cpu"))
    with torch.no_grad():
        blind = batch_logprobs(model, rows, ids, attention, weights != 0)
    assert (blind[weights != 0] - old[weights != 0]).abs().max() > 1e-3


async def test_the_shapes_expert_plays_tool_calls_that_return_pictures():
    """A prompt picture, then tool results with images, through the engine: the expert shows the two
    other pictures and answers what it counted in the three."""
    from rollforge.testing.vlm import make_tiny_vlm

    _, processor = make_tiny_vlm("idefics3")
    renderer = VisionRenderer(processor)
    spec = get_env_spec("shapes")
    scripted = RecordingBackend(expert_backend(spec.expert, renderer, renderer.parser()))
    seen = SeenImages(scripted)
    result = await arollout(spec.samples(2, 0), {"shapes": spec.build()}, seen, renderer, RolloutConfig(max_turns=6))
    assert assert_token_exact(result.trajectories, scripted.calls, renderer) == 6
    assert sorted(seen.counts) == [1, 1, 2, 2, 3, 3]  # each episode: 1, 2, 3 pictures so far
    for t in result.trajectories:
        assert t.total_reward == 1.0 and t.terminated
        assert [(m.role, m.name) for m in t.messages if m.images] == [
            ("user", None),
            ("tool", "show"),
            ("tool", "show"),
        ]


async def test_a_text_only_backend_is_refused_before_the_rollout_starts():
    spec = get_env_spec("shapes")
    tokenizer = make_tokenizer()
    text_only = ScriptedBackend(lambda request: "hi", tokenizer)
    with pytest.raises(ConfigError, match=r"task 'shapes' may return images .* backend ScriptedBackend is text-only"):
        from rollforge.chat.render import ChatRenderer

        await arollout(spec.samples(1, 0), {"shapes": spec.build()}, text_only, ChatRenderer(tokenizer))


async def test_a_text_episode_on_a_vision_model_trains_as_text(vlm):
    """No picture at all: the rows carry no images and the text path's logprobs (shared prompt,
    decoder only) are still the backend's."""
    _, model, processor = vlm
    renderer = VisionRenderer(processor)
    spec = get_env_spec("echo")
    samples = [s for s in spec.samples(2, 0) for _ in range(2)]  # two groups of two
    async with HFVisionBackend(model, processor) as backend:
        result = await arollout(samples, {"echo": spec.build()}, backend, renderer, RolloutConfig(max_new_tokens=5))
    rows, _ = sequences(result.trajectories, renderer.images)
    assert all(row.images is None for row in rows)
    ids, attention, old, weights = collate(rows[:2], [row.mask for row in rows[:2]], 0, torch.device("cpu"))
    with torch.no_grad():
        logprobs = batch_logprobs(model, rows[:2], ids, attention, weights != 0, prefix=rows[0].prompt_length)
    policy = weights != 0
    assert torch.allclose(logprobs[policy], old[policy], atol=1e-4)
