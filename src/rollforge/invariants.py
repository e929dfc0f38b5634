"""The invariants every ``Trajectory`` holds, checked when one is built (``types.Trajectory``).

Token ids, loss mask and logprobs have one entry per token; policy tokens (mask 1), and only they,
carry a logprob; one reward per turn, summing to the total; one ending (``endings.ENDINGS``),
``error`` exactly when a failure is recorded; several segments laid end to end are the
trajectory's tokens. A broken invariant is a rollforge bug (``InvariantError``). This module reads trajectories by their
attributes and imports only ``errors`` and ``endings``, so ``types`` can call it.
"""

from __future__ import annotations

import math
from typing import Any

from .endings import ENDINGS
from .errors import InvariantError


def check_trajectory(t: Any) -> None:
    """Lengths, mask and logprobs, rewards and the ending of trajectory ``t``."""
    n = len(t.token_ids)
    if len(t.loss_mask) != n or len(t.logprobs) != n:
        raise InvariantError(
            f"trajectory {t.index}: {n} token ids, {len(t.loss_mask)} mask entries, "
            f"{len(t.logprobs)} logprobs; they must agree"
        )
    if not _mask_matches_logprobs(t.loss_mask, t.logprobs):
        position, bit, logprob = next(
            (i, b, lp)
            for i, (b, lp) in enumerate(zip(t.loss_mask, t.logprobs))
            if b not in (0, 1) or (b == 1) != (lp is not None)
        )
        raise InvariantError(
            f"trajectory {t.index}: token {position} has mask {bit!r} and logprob "
            f"{logprob!r}; policy tokens (mask 1) and only they carry a logprob"
        )
    if len(t.rewards) != t.turns:
        raise InvariantError(f"trajectory {t.index}: {t.turns} turns, {len(t.rewards)} rewards")
    if not math.isclose(sum(t.rewards), t.total_reward, rel_tol=1e-9, abs_tol=1e-9):
        raise InvariantError(f"trajectory {t.index}: total_reward is not the sum of rewards")
    if t.ending not in ENDINGS or (t.ending == "error") != (t.error is not None):
        raise InvariantError(
            f"trajectory {t.index}: ending {t.ending!r} with error {t.error}; the ending is one of "
            f"{', '.join(ENDINGS)}, and 'error' exactly when an error is set"
        )


def check_segments(t: Any) -> None:
    """Several segments of ``t`` laid end to end are its token ids, mask and logprobs."""
    joined = [tuple(x for s in t.segments for x in getattr(s, name)) for name in ("token_ids", "loss_mask", "logprobs")]
    if joined != [tuple(t.token_ids), tuple(t.loss_mask), tuple(t.logprobs)]:
        raise InvariantError(
            f"trajectory {t.index}: its segments laid end to end are not its token ids, mask and logprobs"
        )
    if t.segments[0].prompt_length != t.prompt_length:
        raise InvariantError(f"trajectory {t.index}: prompt_length is not the first segment's")


def _mask_matches_logprobs(mask: tuple[int, ...], logprobs: tuple[float | None, ...]) -> bool:
    """Fast path of the check (runs on every trajectory): all bits 0/1, logprobs exactly on 1s."""
    return set(mask) <= {0, 1} and [bit == 1 for bit in mask] == [lp is not None for lp in logprobs]
