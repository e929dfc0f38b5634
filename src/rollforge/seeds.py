"""Seed derivation: every seed rollforge derives from a configured one is made here.

Design: a derived seed is the configured seed mixed with the coordinates of what it seeds (a
training step, an episode, a turn, a choice), one coordinate at a time, each with its own prime
multiplier, so that two different coordinate tuples give different seeds::

    mix(seed, a, b, c) = ((seed * 1_000_003 + a) * 1_000_033 + b) * 31 + c

A sampling seed (the one a backend receives) is that number modulo ``2**31 - 1``, so that every
backend accepts it. Held-out samples are drawn from ``seed + 7919 * n`` (``n``: which held-out
set), far from the training samples drawn from ``seed + i`` (``i``: the environment). Replica ``i``
of a backend seeds the requests that carry no seed with ``seed + i``, so that replicas do not
repeat each other's samples. These numbers are part of
reproducibility: runs compare them bit for bit, so the formulas never change.
"""

from __future__ import annotations

#: The multiplier applied before each coordinate, in order (at most three coordinates).
_MULTIPLIERS = (1_000_003, 1_000_033, 31)
#: Sampling seeds are reduced modulo this prime (the largest positive 32-bit signed int).
_SAMPLING_MODULUS = 2**31 - 1
#: The offset between the training samples' seed and the held-out samples' seeds.
_HELD_OUT_OFFSET = 7919


def mix(seed: int, *coordinates: int) -> int:
    """``seed`` mixed with up to three coordinates (unreduced): ``mix(s, a) = s * 1_000_003 + a``."""
    if len(coordinates) > len(_MULTIPLIERS):
        raise ValueError(f"at most {len(_MULTIPLIERS)} coordinates, got {len(coordinates)}")
    for multiplier, coordinate in zip(_MULTIPLIERS, coordinates):
        seed = seed * multiplier + coordinate
    return seed


def sampling_seed(seed: int, *coordinates: int) -> int:
    """The seed a backend samples with: ``mix(seed, *coordinates) % (2**31 - 1)``."""
    return mix(seed, *coordinates) % _SAMPLING_MODULUS


def replica_seed(seed: int | None, i: int) -> int | None:
    """The default seed of replica ``i`` (None stays None: unseeded)."""
    return None if seed is None else seed + i


def held_out_seed(seed: int, n: int = 1) -> int:
    """The seed of the ``n``-th held-out sample set (evaluation prompts, an SFT round's prompts)."""
    return seed + _HELD_OUT_OFFSET * n
