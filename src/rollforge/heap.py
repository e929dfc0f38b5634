"""Giving freed CPU memory back to the system: ``trim()``, called between a step's phases.

On Linux, memory that Python and PyTorch free on the CPU stays in glibc's heap arenas for reuse,
and a training step's phases allocate in different shapes (a rollout's many small KV-cache tensors,
an update's large activations and logits), so what one phase frees the next cannot always reuse:
the process keeps growing. ``malloc_trim(0)`` hands the free pages back. Measured on the
quickstart (SmolLM2-135M, one thread, 2026-11-29): peak resident memory of its GRPO phase about
11 GB without trims, about 5 GB with them, at the same step times. Called after every optimizer
step (``update.optimizer_step``: GRPO and SFT) and after every rollout (``recipes/grpo.roll``).
Where the C library has no ``malloc_trim`` (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def trim() -> bool:
    """Return the heap's free pages to the system; whether any were (False where unsupported)."""
    malloc_trim = _malloc_trim()
    return bool(malloc_trim(0)) if malloc_trim is not None else False
