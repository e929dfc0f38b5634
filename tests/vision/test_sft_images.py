"""SFT on image demonstrations, on the tiny Idefics3: the ``shapes`` expert's episodes (rolled out by
a scripted backend that takes the pictures and ignores them) and a trajectory file that holds the
pictures become examples that show them; the SFT loss forwards their pixels (swapping a picture
changes it), a few steps lower it, and ``rollforge sft`` saves a checkpoint that loads back as a
vision-language model."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
import torch

from rollforge.backends.config import BackendConfig
from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.backends.opening import open_backend
from rollforge.chat.vision import VisionRenderer
from rollforge.envs.library import shapes
from rollforge.errors import ConfigError
from rollforge.recipes.sft import sft_loss, sft_update
from rollforge.recipes.sft_data import expert_backend, expert_demonstrations, read_records, record_examples
from rollforge.recipes.sft_data import trajectory_examples
from rollforge.rollout.config import RolloutConfig
from rollforge.testing.vlm import make_tiny_vlm, save_tiny_vlm

BUDGET = 100_000  # tokens per micro-batch: each batch here is one micro-batch


@pytest.fixture(scope="module")
def demonstrations():
    """(model, processor, renderer, two expert episodes of ``shapes``, their examples)."""
    model, processor = make_tiny_vlm("idefics3", seed=3)
    renderer = VisionRenderer(processor)
    result = asyncio.run(expert_demonstrations("shapes", 2, renderer, RolloutConfig(max_turns=6)))
    examples = [e for t in result.trajectories for e in trajectory_examples(t, renderer.images)]
    return model, processor, renderer, result.trajectories, examples


def _loss(model, processor, examples) -> float:
    return sft_loss(model, examples, micro_batch_tokens=BUDGET, pad_id=processor.tokenizer.pad_token_id)


def test_the_expert_backend_takes_images_only_under_a_vision_renderer(demonstrations):
    _, processor, renderer, _, _ = demonstrations
    from rollforge.chat.render import ChatRenderer

    parser = renderer.parser()
    assert expert_backend(shapes.expert, renderer, parser).accepts_images
    assert not expert_backend(shapes.expert, ChatRenderer(processor.tokenizer), parser).accepts_images


def test_expert_demonstrations_show_their_pictures(demonstrations):
    _, processor, _, trajectories, examples = demonstrations
    assert [t.total_reward for t in trajectories] == [1.0, 1.0]  # the expert counted right
    assert len(examples) == 2
    for trajectory, example in zip(trajectories, examples):
        # the prompt's picture and the two the tool showed, the very objects of the episode
        assert example.images.images == tuple(image for m in trajectory.messages for image in m.images)
        assert len(example.images.images) == shapes.PANELS
        assert example.ids.count(processor.image_token_id) > 0 and sum(example.mask) > 0
        assert all(m == 0 for token, m in zip(example.ids, example.mask) if token == processor.image_token_id)


def test_the_sft_loss_forwards_each_example_s_pixels(demonstrations):
    """The same ids, one picture swapped for another of the same size: another loss. The forward
    pass is seen receiving pixel values."""
    model, processor, renderer, _, examples = demonstrations
    example = examples[0]
    first, *rest = example.images.images
    other = shapes.draw(["circle"] * 9)  # 48 x 48 like every panel, but nine circles
    assert renderer.images.expansion(other) == renderer.images.expansion(first)  # so the ids stay valid
    swapped = replace(example, images=replace(example.images, images=(other, *rest)))
    seen = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs.get("pixel_values")), with_kwargs=True
    )
    try:
        before = _loss(model, processor, [example])
        after = _loss(model, processor, [swapped])
    finally:
        hook.remove()
    assert len(seen) == 2 and all(p is not None and p.dim() >= 4 for p in seen)  # pixels in each forward
    assert not torch.equal(seen[0], seen[1])  # the swapped picture's pixels
    assert abs(before - after) > 1e-4


def test_a_few_sft_steps_lower_the_loss_on_image_demonstrations(demonstrations):
    _, processor, _, _, examples = demonstrations
    model, _ = make_tiny_vlm("idefics3", seed=3)  # a copy of the fixture's weights, trained here
    pad = processor.tokenizer.pad_token_id
    before = _loss(model, processor, examples)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = [sft_update(model, optimizer, examples, micro_batch_tokens=BUDGET, pad_id=pad) for _ in range(4)]
    assert stats[0].loss == pytest.approx(before, rel=1e-5)  # the step's loss is sft_loss's
    assert stats[0].loss_tokens == sum(sum(e.mask) for e in examples)
    after = _loss(model, processor, examples)
    assert after < before - 1.0  # about 7.9 -> 4.8 nats per token


def test_a_trajectory_file_with_pictures_trains_as_the_episodes_do(demonstrations, tmp_path):
    """The episodes written as ``trajectories.jsonl`` (pictures as PNG bytes) read back as the same
    examples, showing the same pixels: the same loss. A text model is refused them."""
    model, processor, renderer, trajectories, examples = demonstrations
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories))
    read = record_examples(read_records(path), 1.0, renderer.images)
    assert [(e.ids, e.mask) for e in read] == [(e.ids, e.mask) for e in examples]
    assert all(isinstance(image, bytes) for e in read for image in e.images.images)
    assert _loss(model, processor, read) == pytest.approx(_loss(model, processor, examples), abs=1e-6)
    with pytest.raises(ConfigError, match="record 1 .* shows images, but the model is text-only"):
        record_examples(read_records(path), 1.0)


def test_a_conversation_of_messages_with_pictures_shows_them(demonstrations):
    """In-memory ``Message``s with images (``sft(config, dataset=...)``): the example holds the
    picture's expansion and the picture, and its loss forwards the pixels."""
    from rollforge.recipes.sft_data import conversation_example
    from rollforge.types import Message

    model, processor, renderer, _, _ = demonstrations
    picture, other = shapes.draw(["circle", "", "square"] * 3), shapes.draw(["square", "", ""] * 3)
    asked = [Message("user", "How many circles?", images=(picture,)), Message("assistant", "Three.")]
    example = conversation_example(renderer, asked)
    expansion = renderer.images.expansion(picture)
    start = example.ids.index(expansion[0])
    assert example.ids[start : start + len(expansion)] == expansion and example.images.images == (picture,)
    shown_other = replace(example, images=replace(example.images, images=(other,)))
    assert abs(_loss(model, processor, [example]) - _loss(model, processor, [shown_other])) > 1e-4


def test_rollforge_sft_trains_a_vlm_whose_checkpoint_loads_back_as_one(demonstrations, tmp_path):
    """``rollforge sft`` on a saved tiny Idefics3, from the shapes expert and a trajectory file: the
    loss falls, and the checkpoint (with its processor) loads back as an ``HFVisionBackend`` whose
    weights are the trained ones (a lower loss on the demonstrations than the start's)."""
    from rollforge.cli.main import main

    _, processor, _, trajectories, examples = demonstrations
    model_dir = save_tiny_vlm(tmp_path / "vlm", "idefics3", seed=3)
    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(t.to_json()) + "\n" for t in trajectories))
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {{name: {model_dir}}}\nout: {tmp_path / 'run'}\nbatch_size: 4\nepochs: 3\n"
        "optim: {lr: 1.0e-3, warmup_steps: 0}\nrollout: {max_turns: 6}\n"
        f"sources:\n  - {{kind: expert, env: shapes, episodes: 2}}\n  - {{kind: trajectories, path: {tmp_path / 'demos.jsonl'}}}\n"
    )
    assert main(["sft", str(config)]) == 0
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in history if "loss" in m]
    assert len(losses) == 3 and losses[-1] < losses[0]
    [step] = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert (step / "model" / "processor_config.json").is_file()
    backend = open_backend(BackendConfig(kind="hf", model=str(step / "model")))
    try:
        assert isinstance(backend, HFVisionBackend)
        assert backend.images.expansion(shapes.draw([""] * 9)) == VisionRenderer(processor).images.expansion(
            shapes.draw([""] * 9)
        )
        start, _ = make_tiny_vlm("idefics3", seed=3)
        assert _loss(backend.model, processor, examples) < _loss(start, processor, examples) - 0.5
    finally:
        asyncio.run(backend.close())
