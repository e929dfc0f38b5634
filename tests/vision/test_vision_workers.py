"""Engine worker processes with a vision-language model: the workers render with the parent's
``VisionRenderer`` (its processor sent with the pool's setup), the images of every turn reach the
backend, and the trajectories (ids, masks, logprobs, images) are those of one process."""

from __future__ import annotations

import asyncio
import io

import pytest

from rollforge.backends.base import CURRENT_EPISODE, BackendWrapper
from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.toolcalls.hermes import HermesParser
from rollforge.chat.vision import VisionRenderer
from rollforge.envs.base import Environment
from rollforge.envs.library import get_env_spec
from rollforge.envs.library.shapes import expert
from rollforge.errors import ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact
from rollforge.testing.vlm import make_tiny_vlm

from vision_helpers import LooksSession, looks_samples


class Looks(Environment):
    """``vision_helpers.looks_env(3)`` at a module's top level: workers unpickle it by reference."""

    produces_images = True

    def open(self, sample):
        return LooksSession(sample.row["seed"], 3)


class SeenImages(BackendWrapper):
    """How many images each request carried (here, in the rollout's process)."""

    def __init__(self, inner):
        super().__init__(inner)
        self.counts: list[int] = []

    async def generate(self, prompt_ids, params, images=()):
        self.counts.append(len(images))
        return await self.inner.generate(prompt_ids, params, images=images)


def shapes_script(request) -> str:
    """The ``shapes`` expert on the requesting episode's conversation (in the worker that runs it);
    module-level, so the scripted backend is reopened in each worker."""
    return expert(tuple(CURRENT_EPISODE.get().messages), HermesParser())


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _kept(trajectories):
    """What must not depend on the number of workers: every id, mask, logprob, reward and image."""
    return [
        (
            t.index,
            t.token_ids,
            t.loss_mask,
            t.logprobs,
            t.total_reward,
            t.error,
            [(m.role, m.content, [_png(i) for i in m.images]) for m in t.messages],
        )
        for t in trajectories
    ]


@pytest.fixture(scope="module")
def idefics3():
    return make_tiny_vlm("idefics3")


def test_hf_vision_backend_through_two_workers_gives_one_process_trajectories(idefics3):
    model, processor = idefics3
    renderer = VisionRenderer(processor)

    async def run(workers: int):
        async with HFVisionBackend(model, processor) as inner:
            recording = RecordingBackend(inner)
            seen = SeenImages(recording)  # no reopener: the workers' requests come here, images and all
            config = RolloutConfig(max_new_tokens=5, max_turns=4, seed=1, concurrency=4, engine_workers=workers)
            result = await arollout(looks_samples(range(4)), {"looks": Looks()}, seen, renderer, config)
            return result.trajectories, recording.calls, seen.counts

    one, _, _ = asyncio.run(run(1))
    two, calls, counts = asyncio.run(run(2))
    assert assert_token_exact(two, calls, renderer) == 12  # three turns of four episodes
    assert sorted(counts) == [1] * 4 + [2] * 4 + [3] * 4  # every image so far, every turn
    for t in two:
        image_tokens = [bit for token, bit in zip(t.token_ids, t.loss_mask) if token == renderer.images.placeholder_id]
        assert len(image_tokens) == sum(renderer.images.tokens(i) for m in t.messages for i in m.images) > 0
        assert set(image_tokens) == {0}
    assert _kept(two) == _kept(one)


def test_shapes_expert_in_two_workers_sees_and_renders_the_pictures(idefics3):
    _, processor = idefics3
    renderer = VisionRenderer(processor)
    spec = get_env_spec("shapes")

    async def run(workers: int):
        backend = ScriptedBackend(shapes_script, processor.tokenizer, accepts_images=True)  # reopened in each worker
        config = RolloutConfig(max_new_tokens=64, max_turns=6, seed=0, concurrency=4, engine_workers=workers)
        async with backend:
            return (
                await arollout(spec.samples(4, 0), {"shapes": spec.build()}, backend, renderer, config)
            ).trajectories

    one, two = asyncio.run(run(1)), asyncio.run(run(2))
    assert [t.total_reward for t in two] == [1.0] * 4  # the expert counted the circles in the pictures
    assert [sum(len(m.images) for m in t.messages) for t in two] == [3] * 4
    assert all(renderer.images.placeholder_id in t.token_ids for t in two)
    assert _kept(two) == _kept(one)


def test_a_processor_that_does_not_pickle_is_refused_in_one_line():
    try:
        import torchvision  # noqa: F401

        pytest.skip("with torchvision the tiny Qwen2-VL's processor is transformers' own and pickles")
    except ImportError:
        pass
    model, processor = make_tiny_vlm("qwen2_vl")  # its processor class is local (no torchvision)
    renderer = VisionRenderer(processor)

    async def run():
        async with HFVisionBackend(model, processor) as backend:
            config = RolloutConfig(max_new_tokens=2, max_turns=1, concurrency=2, engine_workers=2)
            await arollout(looks_samples(range(2)), {"looks": Looks()}, backend, renderer, config)

    with pytest.raises(ConfigError, match=r"^engine_workers=2 sends .* processor\) .* do not pickle") as caught:
        asyncio.run(run())
    assert "\n" not in str(caught.value)


def _alternate(prompts, completions, **_):
    """A reward function that splits every group: 0, 1, 0, 1, ..."""
    return [float(i % 2) for i in range(len(completions))]


def test_rollforge_train_with_two_engine_workers_trains_on_the_pictures(tmp_path):
    import json

    from rollforge.recipes.launch import train
    from rollforge.testing.vlm import save_tiny_vlm
    from rollforge.train.config import load_config

    model_dir = save_tiny_vlm(tmp_path / "vlm", "idefics3", seed=4)
    config = load_config(
        overrides=[
            f"model.name={model_dir}",
            f"out={tmp_path / 'run'}",
            "steps=1",
            "environments=[{name: shapes}]",
            "data.size=8",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=4",
            "rollout.max_turns=2",
            "rollout.engine_workers=2",
            "checkpoint_every=0",
            "save_trajectories=true",
        ]
    )
    [metrics] = train(config, console=False, reward_functions=[_alternate]).history
    assert metrics["policy_tokens"] > 0 and metrics["grad_norm"] > 0
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-5)  # the workers' ids show the pictures
    assert metrics["mismatch/max_abs_log_ratio"] < 1e-4
    records = [json.loads(line) for line in (tmp_path / "run" / "trajectories" / "step-000001.jsonl").open()]
    assert len(records) == 4 and all(r["error"] is None for r in records)
    assert all([len(m.get("images", [])) for m in r["messages"] if m["role"] == "user"] == [1] for r in records)
