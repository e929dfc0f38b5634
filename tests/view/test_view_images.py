"""``rollforge view`` shows an episode's images inline: a real rollout of the ``shapes`` environment
on a tiny vision-language model, written as ``rollforge rollout`` writes it, read back by the
viewer; each message's pictures reach the page as ``<img>`` data URLs of the trajectory's bytes."""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import json
import re
import shutil
import subprocess

import pytest

from rollforge.cli.rollout_results import write_results
from rollforge.view import write_view
from rollforge.view.run import image_urls, load_run

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    """A two-episode rollout of ``shapes`` on the tiny Qwen2-VL: a picture in every prompt."""
    from rollforge.backends.hf_vision import HFVisionBackend
    from rollforge.chat.vision import VisionRenderer
    from rollforge.envs.library import get_env_spec
    from rollforge.rollout.config import RolloutConfig
    from rollforge.rollout.engine import arollout
    from rollforge.testing.vlm import make_tiny_vlm

    model, processor = make_tiny_vlm("qwen2_vl")
    spec = get_env_spec("shapes")

    async def run():
        async with HFVisionBackend(model, processor) as backend:
            config = RolloutConfig(max_new_tokens=3, max_turns=1, seed=0)
            return await arollout(
                spec.samples(2, 0), {"shapes": spec.build()}, backend, VisionRenderer(processor), config
            )

    result = asyncio.run(run())
    out = tmp_path_factory.mktemp("shapes-run")
    write_results(out, result.trajectories, result.metrics)
    return out, result.trajectories


def _bytes(image) -> bytes:
    """The encoded bytes the trajectory JSON holds for ``image``."""
    from rollforge.json_forms import image_bytes

    return image_bytes(image)[1]


def _png(image) -> str:
    return base64.b64encode(_bytes(image)).decode("ascii")


def test_the_payload_carries_each_message_image_as_a_data_url(shapes_run):
    out, trajectories = shapes_run
    [chunk] = load_run(out).chunks
    details = json.loads(gzip.decompress(base64.b64decode(chunk)))
    for trajectory, detail in zip(trajectories, details):
        assert sum(len(m.images) for m in trajectory.messages) > 0
        for message, shown in zip(trajectory.messages, detail["messages"]):
            assert shown["images"] == [f"data:image/png;base64,{_png(image)}" for image in message.images]
    k, message = next((k, m) for k, m in enumerate(trajectories[0].messages) if m.images)
    url = details[0]["messages"][k]["images"][0]
    decoded = PIL.open(io.BytesIO(base64.b64decode(url.removeprefix("data:image/png;base64,"))))
    assert decoded.convert("RGB").tobytes() == PIL.open(io.BytesIO(_bytes(message.images[0]))).convert("RGB").tobytes()


def test_only_raster_images_of_base64_bytes_become_urls():
    png = base64.b64encode(b"\x89PNG...").decode()
    assert image_urls(
        [
            {"type": "image", "mime": "image/png", "base64": png},
            {"type": "image", "mime": "image/svg+xml", "base64": png},  # a picture that can hold script
            {"type": "image", "mime": "image/png", "base64": 'x" onerror="alert(1)'},
            "not an image",
        ]
    ) == [f"data:image/png;base64,{png}", None, None, None]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        pytest.skip("headless Chromium is not installed (apt-get install -y chromium)")
    return found


@pytest.mark.slow
def test_chromium_shows_the_pictures_in_the_episode(shapes_run, tmp_path):
    out, trajectories = shapes_run
    page = write_view(out, tmp_path / "view.html")
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000"]
    done = subprocess.run(
        [*command, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    shown = re.findall(
        r'<img class="msg-image" src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="image (\d+) of', done.stdout
    )
    expected = [_png(image) for m in trajectories[0].messages for image in m.images]  # episode 0 opens first
    assert [data for data, _ in shown] == expected and [k for _, k in shown] == ["1"] * len(expected)
