"""One GRPO step on a tiny vision-language model: the update reads the episodes' pictures (its first
logprobs are the backend's), and the step moves the vision tower as well as the language model."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.chat.vision import VisionRenderer
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing.vlm import make_tiny_vlm
from rollforge.train.advantages import compute_advantages
from rollforge.train.corrections import Proximal
from rollforge.train.losses import TokenMean
from rollforge.train.policy_losses import policy_loss
from rollforge.train.update import TrainedPolicy, UpdateSettings, collate, policy_update, sequences
from rollforge.train.vision import batch_logprobs

from vision_helpers import looks_env, looks_samples


def _roll(model, processor, renderer, group):
    async def run():
        async with HFVisionBackend(model, processor) as backend:
            config = RolloutConfig(max_new_tokens=4, max_turns=3, seed=2)
            return (
                await arollout(looks_samples([7] * group), {"looks": looks_env(2)}, backend, renderer, config)
            ).trajectories

    return asyncio.run(run())


def _parts(model):
    """(the vision tower's and connector's parameters, the language model's)."""
    decoder = list(model.get_decoder().parameters())
    inside = {id(p) for p in decoder} | {id(model.get_output_embeddings().weight)}
    return [p for p in model.parameters() if id(p) not in inside], decoder


def _objective(model, rows, weights, advantages):
    """What the loss descends, to first order: the advantage-weighted logprobs of the policy tokens."""
    ids, attention, _, w = collate(rows, weights, 0, torch.device("cpu"))
    with torch.no_grad():
        logprobs = batch_logprobs(model, rows, ids, attention, w != 0)
    return float((advantages[:, None] * w * logprobs).sum())


@pytest.mark.parametrize("family", ["qwen2_vl", "idefics3"])
def test_one_grpo_step_on_image_episodes(family):
    model, processor = make_tiny_vlm(family, seed=3)
    renderer = VisionRenderer(processor)
    trajectories = _roll(model, processor, renderer, group=3)  # one group: one prompt, one picture
    rows, owners = sequences(trajectories, renderer.images)
    # the reward functions' verdict, here by hand: the first rollout is the good one
    advantages = compute_advantages([1.0, 0.0, 0.0], group_size=3)
    weights = TokenMean().weights([row.mask for row in rows])
    model.requires_grad_(True)
    tower, decoder = _parts(model)
    vision, text = [p.detach().clone() for p in tower], [p.detach().clone() for p in decoder]
    before = _objective(model, rows, weights, advantages.values[owners])
    policy = TrainedPolicy(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    settings = UpdateSettings(micro_batch_tokens=100_000, pad_id=processor.tokenizer.pad_token_id)
    stats = policy_update(
        policy,
        rows,
        advantages.values[owners],
        weights,
        policy_loss("ppo"),
        settings,
        group_size=3,
        proximal=Proximal(len(rows)),
    )
    assert stats.policy_tokens == sum(int(row.mask.sum()) for row in rows) > 0
    assert stats.mean_ratio == pytest.approx(1.0, abs=1e-5)  # the first logprobs are the backend's
    assert stats.mismatch_max_abs_log_ratio < 1e-4
    assert stats.grad_norm > 0
    assert any(not torch.equal(p, q) for p, q in zip(tower, vision))  # the gradient reached the vision tower
    assert any(not torch.equal(p, q) for p, q in zip(decoder, text))
    assert _objective(model, rows, weights, advantages.values[owners]) > before  # a small step up the objective


def _alternate(prompts, completions, **_):
    """A reward function that splits every group: 0, 1, 0, 1, ..."""
    return [float(i % 2) for i in range(len(completions))]


def test_rollforge_train_runs_grpo_on_the_shapes_environment(tmp_path):
    """The train API end to end on a saved tiny Idefics3: the model directory's processor makes the
    renderer a ``VisionRenderer`` and the hf backend an ``HFVisionBackend``; the step trains on rows
    that show the pictures, and its first logprobs are the backend's (the run's own mismatch)."""
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
            "algorithm.batch_size=1",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=4",
            "rollout.max_turns=2",
            "checkpoint_every=0",
            "save_trajectories=true",
        ]
    )
    result = train(config, console=False, reward_functions=[_alternate])
    [metrics] = result.history
    assert metrics["policy_tokens"] > 0 and metrics["grad_norm"] > 0
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["mismatch/max_abs_log_ratio"] < 1e-4
    image_token = make_tiny_vlm("idefics3")[1].image_token_id
    for line in (result.out / "trajectories" / "step-000001.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["error"] is None
        assert [len(m.get("images", [])) for m in record["messages"] if m["role"] == "user"] == [1]
        assert record["token_ids"].count(image_token) > 0
