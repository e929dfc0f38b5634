"""Giving freed CPU memory back to the system: ``trim()``, called between a step's phases.

On Linux, memory that Python and PyTorch free on the CPU stays in glibc's heap arenas for reuse,
and a training step's phases allocate in different shapes (a rollout's many small KV-cache tensors,
an update's large activations and logits), so what one phase frees the next cannot always reuse:
the process keeps growing. ``malloc_trim(0)`` hands the free pages back; the cost is that the next
phase faults fresh pages in (about a second a trim for the quickstart's gigabytes), so it runs
twice a GRPO step, both in ``train/learn``: before the update (what the step's rollout rounds
freed) and after its epochs. Measured on the quickstart (SmolLM2-135M, 2026-11-29): peak resident memory
11.7-11.9 GB without trims, 7.7 GB with these two (6.3 GB with a trim after every optimizer step, which
cost ~50 s a run; see docs/benchmarks.md).
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
