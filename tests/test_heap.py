"""``heap.trim``: freed heap memory goes back to the system (glibc Linux), and nothing breaks
where the C library cannot (the function says so)."""

from __future__ import annotations

import platform

import pytest

from rollforge import heap


def resident_kb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc Linux")
def test_freed_small_blocks_return_to_the_system():
    heap.trim()
    before = resident_kb()
    # 256 MiB in blocks below glibc's mmap threshold: they live in the heap, and stay there once freed
    blocks = [bytearray(64 * 1024) for _ in range(4096)]
    grown = resident_kb()
    keep = blocks[-1:]  # the top block stays in use, so the heap cannot simply shrink from its end
    del blocks
    assert grown - before > 200_000 and keep
    assert heap.trim() is True
    assert resident_kb() - before < 50_000  # the free pages in the middle went back too


def test_without_malloc_trim_it_does_nothing(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.trim() is False
