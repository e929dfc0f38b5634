"""Tools that return images: kept in the trajectory (JSON included), passed to backends that accept
images, refused at start-up for text-only backends, and an undeclared image fails only its episode."""

from __future__ import annotations

import base64
import io

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample

Image = pytest.importorskip("PIL.Image")

DRAW = '<tool_call>\n{"name": "draw", "arguments": {"shade": 200}}\n</tool_call>'


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


class Canvas:
    """Draws a 3x2 grey picture (a PIL image), then the episode is done."""

    def reset(self, **row) -> str:
        self.done = False
        return "Draw something."

    def draw(self, shade: int):
        """Draw a picture.

        Args:
            shade: The grey level, 0-255.
        """
        self.done = True
        return ["Here it is:", Image.new("L", (3, 2), color=shade)]


class BlockCanvas(Canvas):
    """The same, returning MCP-style content blocks."""

    def draw(self, shade: int):
        """Draw a picture.

        Args:
            shade: The grey level, 0-255.
        """
        self.done = True
        buffer = io.BytesIO()
        Image.new("L", (3, 2), color=shade).save(buffer, format="PNG")
        data = base64.b64encode(buffer.getvalue()).decode()
        return [{"type": "text", "text": "Here it is:"}, {"type": "image", "data": data, "mimeType": "image/png"}]


class VisionBackend(ScriptedBackend):
    """A scripted backend that declares it accepts images and records what it was given."""

    accepts_images = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.images_seen: list[tuple] = []

    async def generate(self, prompt_ids, params, images=()):
        self.images_seen.append(tuple(images))
        return await super().generate(prompt_ids, params)


def samples(n: int) -> list[Sample]:
    return [Sample(prompt=[{"role": "user", "content": f"Picture {i}."}], task_name="draw") for i in range(n)]


def reply_draw_then_stop(request) -> str:
    return DRAW if request.call % 2 == 0 else "Done."


@pytest.mark.parametrize("canvas", [Canvas, BlockCanvas])
async def test_images_reach_an_image_backend_and_stay_in_the_trajectory(renderer, canvas):
    backend = VisionBackend(lambda r: DRAW, renderer, end_token_id=renderer.stop_token_ids[0])
    env = FactoryEnvironment(canvas, produces_images=True)
    result = await arollout(samples(1), {"draw": env}, backend, renderer, RolloutConfig(max_turns=3))
    t = result.trajectories[0]
    assert t.terminated and t.error is None
    tool = t.messages[-1]
    assert tool.role == "tool" and tool.content == "Here it is:" and len(tool.images) == 1
    assert backend.images_seen == [()]  # the one generation came before the picture existed
    record = t.to_json()["messages"][-1]
    assert record["images"][0]["mime"] == "image/png"
    decoded = Image.open(io.BytesIO(base64.b64decode(record["images"][0]["base64"])))
    assert decoded.size == (3, 2) and decoded.getpixel((0, 0)) == 200  # lossless


async def test_images_are_passed_on_every_later_generation(renderer):
    class TwoPictures(Canvas):
        def draw(self, shade: int):
            """Draw a picture.

            Args:
                shade: The grey level, 0-255.
            """
            self.count = getattr(self, "count", 0) + 1
            self.done = self.count == 2
            return Image.new("L", (1, 1), color=shade)

    backend = VisionBackend(lambda r: DRAW, renderer, end_token_id=renderer.stop_token_ids[0])
    result = await arollout(
        samples(1),
        {"draw": FactoryEnvironment(TwoPictures, produces_images=True)},
        backend,
        renderer,
        RolloutConfig(max_turns=4),
    )
    assert result.trajectories[0].terminated
    assert [len(images) for images in backend.images_seen] == [0, 1]  # all images so far, in order


async def test_declared_images_with_a_text_only_backend_fail_at_start(renderer):
    backend = ScriptedBackend(lambda r: DRAW, renderer, end_token_id=renderer.stop_token_ids[0])
    with pytest.raises(ConfigError, match=r"task 'draw' may return images .*ScriptedBackend is text-only"):
        await arollout(samples(2), {"draw": FactoryEnvironment(Canvas, produces_images=True)}, backend, renderer)
    assert backend.calls == 0


async def test_an_undeclared_image_fails_only_its_episode_with_a_clear_reason(renderer):
    class Sometimes(Canvas):
        def reset(self, picture: bool, **row) -> str:
            self.picture = picture
            return super().reset()

        def draw(self, shade: int):
            """Draw a picture.

            Args:
                shade: The grey level, 0-255.
            """
            self.done = True
            return Image.new("L", (1, 1)) if self.picture else "no picture today"

    backend = ScriptedBackend(lambda r: DRAW, renderer, end_token_id=renderer.stop_token_ids[0])
    batch = [
        Sample(prompt=[{"role": "user", "content": "Go."}], task_name="draw", row={"picture": i == 1}) for i in range(3)
    ]
    result = await arollout(batch, {"draw": FactoryEnvironment(Sometimes)}, backend, renderer)
    ok, bad, ok2 = result.trajectories
    assert ok.terminated and ok2.terminated and ok.error is None
    assert bad.error is not None and bad.error.kind == "env_error"
    assert "returned 1 image(s)" in bad.error.message and "text-only" in bad.error.message
    assert len(bad.messages[-1].images) == 1  # kept in the trajectory for inspection
    assert bad.to_json()["messages"][-1]["images"][0]["mime"] == "image/png"
