"""The sizes of ``rollforge bench gpu``: one frozen value for the whole run, read by every section.

``FULL`` is the default run (sized for about 4-5 minutes a model on one H100), ``QUICK`` the
``--quick`` one (seconds on a CPU); ``dataclasses.replace`` sets the seed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSettings:
    grpo_steps: int = 4  # GRPO steps per side, the first an untimed warm-up
    batch_size: int = 8  # GRPO prompts per step
    generations: int = 8  # GRPO completions per prompt
    max_new_tokens: int = 256  # GRPO tokens per completion
    gen_prompt_tokens: int = 128  # generation: random prompt ids per row (rows and lengths are GRPO's)
    fsdp_steps: int = 2  # FSDP2 updates before the checkpoint
    fsdp_batch: int = 4  # FSDP2 rows per update
    fsdp_seq_len: int = 2048  # FSDP2 random tokens per row
    pack_tokens: int = 16384  # train_throughput: tokens per pack
    pack_steps: int = 3  # train_throughput: timed steps after one warm-up
    vision_model: str = "smolvlm-256m"  # vision: the model (gpu/vision.py SIZES)
    vision_episodes: int = 8  # vision: episodes generated, then updated on
    vision_turns: int = 3  # vision: turns per episode, a new picture each
    vision_new_tokens: int = 64  # vision: tokens per reply
    vision_picture: int = 512  # vision: pixels a side of each picture
    seed: int = 0


FULL = GpuSettings()
QUICK = GpuSettings(
    grpo_steps=2,
    batch_size=2,
    generations=2,
    max_new_tokens=8,
    gen_prompt_tokens=8,
    fsdp_steps=1,
    fsdp_batch=2,
    fsdp_seq_len=32,
    pack_tokens=256,
    pack_steps=1,
    vision_model="tiny",
    vision_episodes=2,
    vision_turns=2,
    vision_new_tokens=4,
    vision_picture=64,
)
