"""Update rows in GRPO groups for the loss tests on the tiny model: each group's rows share a
7-token prompt, their continuations differ in length (so the planner reorders them) and hold one
environment token (mask 0) in the middle. Behaviour logprobs are 0: each test sets its own."""

from __future__ import annotations

import torch

from rollforge.train.update import UpdateRow

PROMPT_LENGTH = 7


def grouped_rows(seed: int, groups: int, size: int) -> list[UpdateRow]:
    """``groups`` x ``size`` rows, member m of a group with a continuation of 4 + 3m tokens (m odd)
    or 12 - m (m even), drawn from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(groups):
        prompt = torch.randint(3, 600, (PROMPT_LENGTH,), generator=g)
        for member in range(size):
            n = 4 + 3 * member if member % 2 else 12 - member
            ids = torch.cat([prompt, torch.randint(3, 600, (n,), generator=g)])
            mask = torch.cat([torch.zeros(PROMPT_LENGTH), torch.ones(n)])
            mask[PROMPT_LENGTH + n // 2] = 0
            rows.append(UpdateRow(ids, mask, torch.zeros(ids.numel()), prompt_length=PROMPT_LENGTH))
    return rows
