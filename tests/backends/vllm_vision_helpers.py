"""Helpers the vLLM and OpenAI-compatible image tests share: a tiny Idefics3 that vLLM's CPU build
runs, pictures, a prompt with pictures, the transformers reference logprobs, and an environment whose
tool results are pictures."""

from __future__ import annotations

import pytest
import torch

from rollforge.types import Message, Sample

PIL = pytest.importorskip("PIL.Image")


def picture(k: int, size: tuple[int, int] = (56, 40)):
    """A plain picture whose colour depends on ``k``; sizes vary the token count."""
    return PIL.new("RGB", size, ((70 * k) % 256, (130 + 50 * k) % 256, 200))


def save_tiny_idefics3(directory, seed: int = 0):
    """``tiny_idefics3(seed)`` (model and processor) written to ``directory``; returns it."""
    model, processor = tiny_idefics3(seed)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def tiny_idefics3(seed: int = 0):
    """``make_tiny_vlm("idefics3")`` with its decoder's 64 dimensions in 2 heads of 32 (1 KV head):
    vLLM's CPU attention takes head sizes 32, 64, 80, ... and refuses the tiny model's 16 at the
    first request ("Unsupported CPU attention configuration: head_dim=16")."""
    from transformers import Idefics3ForConditionalGeneration

    from rollforge.testing.vlm import make_tiny_vlm

    model, processor = make_tiny_vlm("idefics3", seed)
    config = model.config
    config.text_config.num_attention_heads, config.text_config.num_key_value_heads = 2, 1
    config.text_config.head_dim = 32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        rebuilt = Idefics3ForConditionalGeneration(config).eval()
    rebuilt.generation_config = model.generation_config
    return rebuilt, processor


def image_prompt(renderer, *images) -> list[int]:
    message = Message("user", "What do you see?", images=images)
    return renderer.conversation_ids([message], add_generation_prompt=True)


def teacher_forced(model, processor, prompt, completion, images) -> torch.Tensor:
    from rollforge.images import ImageProcessing

    ids = list(prompt) + list(completion)
    inputs = ImageProcessing(processor).inputs(ids, images)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), **inputs).logits[0].float()  # (T, V)
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (n, V)
    return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


class Looks:
    """A picture in the prompt, then a new picture in a ``look`` tool result after each reply (of a
    new size each turn); the episode ends after ``turns`` replies."""

    def __init__(self, seed: int, turns: int):
        self.seed, self.turns, self.turn = seed, turns, 0

    async def reset(self, sample):
        from rollforge.envs.base import Reset, append_to_last_user

        return Reset(append_to_last_user(sample.prompt, "Here is the first one.", (picture(self.seed),)))

    async def step(self, conversation):
        from rollforge.envs.base import Step

        self.turn += 1
        if self.turn == self.turns:
            return Step(terminated=True, reward=1.0)
        image = picture(self.seed + self.turn, (40 + 30 * self.turn, 36))
        return Step((Message("tool", f"Picture {self.turn + 1}.", name="look", images=(image,)),))

    async def finish(self):
        return 0.0

    async def close(self):
        return None

    metadata = None
    handle = None


def looks_env(turns: int):
    from rollforge.envs.base import Environment

    class LooksEnvironment(Environment):
        produces_images = True

        def open(self, sample):
            return Looks(sample.row["seed"], turns)

    return LooksEnvironment()


def looks_samples(seeds):
    return [Sample((Message("user", "What do you see?"),), task_name="looks", row={"seed": s}) for s in seeds]


# The fixtures both image test files use (imported there by name: pytest finds them in the module).
@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    """The tiny Idefics3 saved once per test module."""
    return save_tiny_idefics3(tmp_path_factory.mktemp("tiny-idefics3"))


@pytest.fixture(scope="module")
def hf_vlm(vlm_dir):
    """The checkpoint in transformers, ``(model, processor)``, as a run loads it."""
    from rollforge.models import load_model, load_processor

    processor = load_processor(vlm_dir)
    model, _ = load_model(vlm_dir, tokenizer=processor.tokenizer)
    return model, processor


@pytest.fixture(scope="module")
def renderer(hf_vlm):
    from rollforge.chat.vision import VisionRenderer

    return VisionRenderer(hf_vlm[1])
