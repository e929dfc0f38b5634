"""Helpers for rollforge's tests and benchmarks, public and in one place.

Nothing here downloads or needs a GPU. One module per concern, re-exported here:

- ``tiny``: ``make_tiny_model(directory)``, a seeded offline chat model (byte-level BPE tokenizer,
  SmolLM2's ChatML template, random two-layer Llama); ``make_tokenizer()`` its tokenizer alone.
- ``vlm``: ``make_tiny_vlm(family)``, ``(model, processor)`` of a tiny random vision-language model
  of a real architecture (Qwen2-VL, Idefics3) with its real processor; ``save_tiny_vlm(directory)``.
- ``tasks``: ``FirstCharacter``, a task the tiny model learns in a few dozen GRPO steps.
- ``recording``: ``RecordingBackend``, a backend wrapper that keeps every request; ``AllAtOnce``, one
  that holds its first n requests until all n are in flight (concurrency claims without timing).
- ``exactness``: the token-exactness assertions (kept generations, renderings of messages, whole
  trajectories: ``assert_faithful``).
- ``harness``: ``wait_until(condition)`` / ``await until(condition)``, waits
  bounded only against hangs; ``free_port()`` comes from ``rollforge.ports``.
"""

from __future__ import annotations

from ..ports import free_port
from .exactness import (
    assert_faithful,
    assert_replies_exact,
    assert_segment_exact,
    assert_token_exact,
    generated_ids,
    renders_its_messages,
)
from .harness import HANG_SECONDS, until, wait_until
from .recording import AllAtOnce, RecordingBackend, Request
from .tasks import FIRST_CHARACTER_KINDS, FirstCharacter, first_character_rows
from .tiny import (
    CHATML_TEMPLATE,
    CORPUS,
    DEFAULT_SYSTEM_PROMPT,
    END_OF_TEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    make_tiny_model,
    make_tokenizer,
    tokenizer_or_tiny,
)
from .vlm import VLM_FAMILIES, make_tiny_vlm, save_tiny_vlm

__all__ = [
    "AllAtOnce",
    "CHATML_TEMPLATE",
    "CORPUS",
    "DEFAULT_SYSTEM_PROMPT",
    "END_OF_TEXT",
    "FIRST_CHARACTER_KINDS",
    "FirstCharacter",
    "HANG_SECONDS",
    "IM_END",
    "IM_START",
    "RecordingBackend",
    "Request",
    "SPECIAL_TOKENS",
    "VLM_FAMILIES",
    "assert_faithful",
    "assert_replies_exact",
    "assert_segment_exact",
    "assert_token_exact",
    "first_character_rows",
    "free_port",
    "generated_ids",
    "make_tiny_model",
    "make_tiny_vlm",
    "make_tokenizer",
    "renders_its_messages",
    "save_tiny_vlm",
    "tokenizer_or_tiny",
    "until",
    "wait_until",
]
