"""Ray replicas of a vision-language model: two HF replicas of a saved tiny Idefics3 (each actor
loads it as ``HFVisionBackend``) declare ``accepts_images`` once started, every request's pictures
travel to the actor, and the episodes are those of the same backend in this process."""

from __future__ import annotations

import dataclasses

import pytest

from rollforge.backends.config import BackendConfig
from rollforge.backends.opening import open_backend
from rollforge.backends.router import RouterBackend
from rollforge.bench.gpu.vision import Pictures
from rollforge.chat.vision import VisionRenderer
from rollforge.cluster.generation import open_generation
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact
from rollforge.testing.vlm import save_tiny_vlm
from rollforge.types import Message, Sample

pytestmark = pytest.mark.slow
pytest.importorskip("PIL.Image")


async def _episodes(backend, renderer):
    """Four episodes of three turns, a new 40-pixel picture each turn."""
    samples = [Sample((Message("user", "Look."),), task_name="pictures", row={"seed": k}) for k in range(4)]
    config = RolloutConfig(max_new_tokens=4, max_turns=3, seed=3, concurrency=4)
    return (await arollout(samples, {"pictures": Pictures(40, 3)}, backend, renderer, config)).trajectories


def _kept(trajectories):
    return [(t.token_ids, t.loss_mask, [len(m.images) for m in t.messages], t.error) for t in trajectories]


async def test_hf_vision_replicas_take_every_picture_and_match_this_process(ray_session, tmp_path):
    model_dir = save_tiny_vlm(tmp_path / "vlm", "idefics3", seed=5)
    config = BackendConfig(model=str(model_dir), replica_cpus=0, concurrency=4, seed=0)
    local = open_backend(config)  # the same loading path as each actor's
    renderer = VisionRenderer(local.processor)
    try:
        expected = await _episodes(local, renderer)
    finally:
        await local.close()
    router = open_generation(dataclasses.replace(config, replicas=2))
    assert isinstance(router, RouterBackend)
    assert router.accepts_images and [r.accepts_images for r in router.replicas] == [True, True]
    recording = RecordingBackend(router)
    try:
        got = await _episodes(recording, renderer)
    finally:
        await router.close()
    assert assert_token_exact(got, recording.calls, renderer) == 12  # three turns of four episodes
    assert [sum(len(m.images) for m in t.messages) for t in got] == [3] * 4
    assert _kept(got) == _kept(expected)
    for mine, theirs in zip(got, expected):
        sampled = [(a, b) for a, b in zip(mine.logprobs, theirs.logprobs) if a is not None]  # policy tokens
        assert len(sampled) == 12 and max(abs(a - b) for a, b in sampled) < 1e-4
    assert {t.served_by.generation.name for t in got} == {"hf replica 0", "hf replica 1"}
