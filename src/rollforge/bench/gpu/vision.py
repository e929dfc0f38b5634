"""The vision-language section of ``rollforge bench gpu``: generation with a picture per turn, and
one GRPO update on those episodes, with a random-initialised SmolVLM-256M.

The model: ``Idefics3ForConditionalGeneration`` (SmolVLM's architecture) initialised at random
from SmolVLM-256M-Instruct's published config (numbers below: a SmolLM2-135M decoder, a SigLIP
base patch-16/512 tower, pixel shuffle 4, so 64 tokens per 512-pixel tile), with its image
processing (images resized to 2,048 pixels on the long edge, split into 512-pixel tiles plus a
global view). Nothing is downloaded: the processor is built here around the offline tokenizer of
``rollforge.testing.make_tiny_vlm("idefics3")`` (its image tokens and ChatML template), its
vocabulary padded to the model's 49,280 ids as the text sections pad theirs. ``--quick`` uses the
sizes of ``rollforge.testing``'s tiny Idefics3 instead (seconds on a CPU).

- generation: ``HFVisionBackend`` plays ``vision_episodes`` episodes of ``vision_turns`` turns;
  the prompt shows a random-noise picture of ``vision_picture`` pixels a side and every reply is
  answered by a tool message with a new one, so turn ``k`` prefills ``k`` pictures. A random model
  almost never ends its turn: each reply runs to ``vision_new_tokens``. Reported: generated
  tokens/s (over the rollout's wall time, prefills included), tokens per picture, the longest
  prompt, peak device memory.
- update: one GRPO step (PPO-clip loss, AdamW) on those episodes' rows, each forwarded with its
  pictures (``train.vision``), advantages +1/-1 by hand (a random model earns no reward); its time,
  trained tokens/s, peak memory, and ``mean_ratio`` / ``mismatch_max_abs_log_ratio``: the update's
  first logprobs against the backend's (1 and ~0 when both saw the same pixels).

float32 master weights under bfloat16 autocast on CUDA, float32 on a CPU, as the ``grpo`` section.
Never run on a GPU yet: only the ``--quick`` size has run, on a CPU (``tests/bench/test_gpu_vision.py``).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...envs.base import BaseSession, Environment, Reset, Step, append_to_last_user
from ...testing.vlm import IDEFICS3_EDGES, IDEFICS3_SCALE, IDEFICS3_TEMPLATE, IDEFICS3_VISION, TINY_TEXT, make_tiny_vlm
from ...types import Message, Sample
from .settings import GpuSettings


@dataclass(frozen=True)
class VlmSize:
    """An Idefics3 model's config numbers and its image processing."""

    text: dict[str, Any]  # the decoder's (a Llama), vocab_size None: the tokenizer's
    vision: dict[str, Any]  # the SigLIP tower's
    scale_factor: int  # pixel shuffle: a tile's (image_size / patch_size)^2 patches over scale_factor^2
    longest_edge: int  # images are resized to this many pixels on the long edge
    tile: int  # then split into tiles of this many pixels a side (plus a global view)
    tie_word_embeddings: bool = False
    image_seq_len: int = field(init=False)  # tokens per tile

    def __post_init__(self) -> None:
        patches = (self.vision["image_size"] // self.vision["patch_size"]) ** 2
        object.__setattr__(self, "image_seq_len", patches // self.scale_factor**2)


SIZES = {
    # HuggingFaceTB/SmolVLM-256M-Instruct's config.json and preprocessor_config.json: 256,484,928 parameters
    "smolvlm-256m": VlmSize(
        text=dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            head_dim=64,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            vocab_size=49280,
        ),
        vision=dict(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=512,
            patch_size=16,
        ),
        scale_factor=4,
        longest_edge=2048,
        tile=512,
    ),
    # rollforge.testing's tiny Idefics3: 4 tokens per 56-pixel tile
    "tiny": VlmSize(
        text={**TINY_TEXT, "vocab_size": None},
        vision=IDEFICS3_VISION,
        scale_factor=IDEFICS3_SCALE,
        longest_edge=IDEFICS3_EDGES[0],
        tile=IDEFICS3_EDGES[1],
    ),
}


def run(where: Any, s: GpuSettings, scratch: Path) -> dict[str, Any]:
    """The section: build the model, generate, update (see the module docstring)."""
    from ...chat.vision import VisionRenderer

    size = SIZES[s.vision_model]
    began = time.perf_counter()
    model, processor = build_vlm(size, where, scratch, s.seed)
    built = time.perf_counter() - began
    renderer = VisionRenderer(processor)
    _reset_peak(where)
    trajectories, generation = _generate(model, processor, renderer, where, s)
    _reset_peak(where)
    update = _update(model, processor, renderer, trajectories, where)
    return {
        "model": s.vision_model,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "image_tokens_per_tile": size.image_seq_len,
        "build_seconds": round(built, 2),
        "dtype": "bfloat16 autocast over float32" if where.type == "cuda" else "float32",
        "generation": generation,
        "update": update,
    }


def build_vlm(size: VlmSize, where: Any, scratch: Path, seed: int) -> tuple[Any, Any]:
    """``(model, processor)``: a random ``size`` model in float32 on ``where``, and its processor."""
    import torch
    from transformers import AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from .sections import pad_vocabulary

    _, tiny = make_tiny_vlm("idefics3")  # its tokenizer: ChatML and Idefics3's image tokens
    vocab = size.text["vocab_size"] or len(tiny.tokenizer)
    tiny.tokenizer.save_pretrained(scratch / "tokenizer")
    pad_vocabulary(scratch / "tokenizer" / "tokenizer.json", vocab)  # every id the model samples decodes
    tokenizer = AutoTokenizer.from_pretrained(scratch / "tokenizer")
    tokenizer.model_max_length = size.text["max_position_embeddings"]  # the test tokenizer's is 1,024
    images = Idefics3ImageProcessorPil(
        size={"longest_edge": size.longest_edge}, max_image_size={"longest_edge": size.tile}
    )
    processor = Idefics3Processor(images, tokenizer, image_seq_len=size.image_seq_len, chat_template=IDEFICS3_TEMPLATE)
    text = {**size.text, "vocab_size": vocab, "model_type": "llama"}
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    config = Idefics3Config(
        text_config={**text, **ids, "pad_token_id": tokenizer.pad_token_id},
        vision_config=size.vision,
        scale_factor=size.scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=size.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    with torch.device(where):
        model = Idefics3ForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, processor


class Pictures(Environment):
    """A new random picture of ``side`` pixels every turn, ``turns`` turns, whatever the reply."""

    produces_images = True

    def __init__(self, side: int, turns: int):
        self.side, self.turns = side, turns

    def open(self, sample: Sample) -> "PicturesSession":
        return PicturesSession(self.side, self.turns, random.Random(sample.row["seed"]))


class PicturesSession(BaseSession):
    """One episode of ``Pictures``: the prompt's picture, then one in each tool message."""

    def __init__(self, side: int, turns: int, rng: random.Random):
        self.side, self.turns, self.rng, self.turn = side, turns, rng, 0

    def picture(self) -> Any:
        from PIL import Image

        return Image.frombytes("RGB", (self.side, self.side), self.rng.randbytes(self.side * self.side * 3))

    async def reset(self, sample: Sample) -> Reset:
        return Reset(append_to_last_user(sample.prompt, "Describe each picture.", (self.picture(),)))

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        self.turn += 1
        if self.turn == self.turns:
            return Step(terminated=True)
        return Step((Message("tool", f"Picture {self.turn + 1}.", name="look", images=(self.picture(),)),))


def _generate(model: Any, processor: Any, renderer: Any, where: Any, s: GpuSettings) -> tuple[Any, dict[str, Any]]:
    import torch

    from ...backends.hf_vision import HFVisionBackend
    from ...backends.settings import HFSettings
    from ...rollout.config import RolloutConfig
    from ...rollout.engine import arollout

    settings = HFSettings(seed=s.seed, compute_dtype=torch.bfloat16 if where.type == "cuda" else None)
    config = RolloutConfig(
        max_new_tokens=s.vision_new_tokens,
        max_turns=s.vision_turns,
        max_seq_len=model.config.text_config.max_position_embeddings,
        concurrency=s.vision_episodes,
        seed=s.seed,
    )
    prompt = (Message("user", "What do you see?"),)
    samples = [Sample(prompt, task_name="pictures", row={"seed": k}) for k in range(s.vision_episodes)]
    env = Pictures(s.vision_picture, s.vision_turns)

    async def roll() -> Any:
        async with HFVisionBackend(model, processor, settings) as backend:
            return await arollout(samples, {"pictures": env}, backend, renderer, config)

    began = time.perf_counter()
    result = asyncio.run(roll())
    seconds = time.perf_counter() - began
    trajectories = result.trajectories
    failed = [t.error for t in trajectories if t.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(trajectories)} episodes failed, the first: {failed[0]}")
    generated = sum(sum(t.loss_mask) for t in trajectories)
    pictures = [image for t in trajectories for m in t.messages for image in m.images]
    return trajectories, {
        "episodes": len(trajectories),
        "turns": sum(t.turns for t in trajectories),
        "pictures": len(pictures),
        "picture_pixels": f"{s.vision_picture}x{s.vision_picture}",
        "tokens_per_picture": renderer.images.tokens(pictures[0]),
        "longest_prompt_tokens": max(len(t.token_ids) for t in trajectories),
        "generated_tokens": generated,
        "seconds": round(seconds, 2),
        "generation_tokens_per_s": round(generated / seconds, 1),
        "peak_memory_gib": _peak(where),
    }


def _update(model: Any, processor: Any, renderer: Any, trajectories: Any, where: Any) -> dict[str, Any]:
    """One GRPO step on ``trajectories``' rows with their pictures."""
    import torch

    from ...train.corrections import Proximal
    from ...train.losses import TokenMean
    from ...train.policy_losses import policy_loss
    from ...train.update import TrainedPolicy, UpdateSettings, policy_update, sequences

    rows, owners = sequences(trajectories, renderer.images)
    signs = torch.tensor([1.0 if k % 2 == 0 else -1.0 for k in range(len(trajectories))])  # (N,)
    weights = TokenMean().weights([row.mask for row in rows])
    model.requires_grad_(True)
    policy = TrainedPolicy(model, torch.optim.AdamW(model.parameters(), lr=1e-6))
    settings = UpdateSettings(
        micro_batch_tokens=max(row.ids.numel() for row in rows),
        pad_id=processor.tokenizer.pad_token_id,
        compute_dtype=torch.bfloat16 if where.type == "cuda" else torch.float32,
        skip_zero_advantage=False,
    )
    _synchronize(where)
    began = time.perf_counter()
    stats = policy_update(
        policy, rows, signs[owners], weights, policy_loss("ppo"), settings, proximal=Proximal(len(rows))
    )
    _synchronize(where)
    seconds = time.perf_counter() - began
    tokens = sum(row.ids.numel() for row in rows)
    return {
        "rows": len(rows),
        "tokens": tokens,
        "policy_tokens": stats.policy_tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "mean_ratio": round(stats.mean_ratio, 6),
        "mismatch_max_abs_log_ratio": stats.mismatch_max_abs_log_ratio,
        "peak_memory_gib": _peak(where),
    }


def _reset_peak(where: Any) -> None:
    import torch

    if where.type == "cuda":
        torch.cuda.reset_peak_memory_stats(where)


def _peak(where: Any) -> float | None:
    """Peak device memory since the last reset, GiB; None on a CPU."""
    import torch

    return round(torch.cuda.max_memory_allocated(where) / 2**30, 2) if where.type == "cuda" else None


def _synchronize(where: Any) -> None:
    import torch

    if where.type == "cuda":
        torch.cuda.synchronize(where)
