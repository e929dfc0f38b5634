"""Helpers the vision tests share: small pictures that differ from each other."""

from __future__ import annotations

import pytest

PIL = pytest.importorskip("PIL.Image")


def picture(k: int, size: tuple[int, int] = (56, 40)):
    """A plain picture whose colour depends on ``k``; sizes vary the token count."""
    return PIL.new("RGB", size, ((70 * k) % 256, (130 + 50 * k) % 256, 200))


class LooksSession:
    """A picture in the prompt, then a new one in a ``look`` tool result after each reply; the
    episode ends after ``turns`` replies with the reward ``seed``."""

    def __init__(self, seed: int, turns: int):
        self.seed, self.turns, self.turn = seed, turns, 0

    async def reset(self, sample):
        from rollforge.envs.base import Reset, append_to_last_user

        return Reset(append_to_last_user(sample.prompt, "Here is the first one.", (picture(self.seed),)))

    async def step(self, conversation):
        from rollforge.envs.base import Step
        from rollforge.types import Message

        self.turn += 1
        if self.turn == self.turns:
            return Step(terminated=True, reward=float(self.seed))
        image = picture(self.seed + self.turn, (40 + 8 * self.turn, 36))
        return Step((Message("tool", f"Picture {self.turn + 1}.", name="look", images=(image,)),))

    async def finish(self):
        return 0.0

    async def close(self):
        return None

    metadata = None
    handle = None


def looks_env(turns: int = 3):
    """An environment of ``LooksSession``s (declares ``produces_images``)."""
    from rollforge.envs.base import Environment

    class Looks(Environment):
        produces_images = True

        def open(self, sample):
            return LooksSession(sample.row["seed"], turns)

    return Looks()


def looks_samples(seeds):
    from rollforge.types import Message, Sample

    return [Sample((Message("user", "What do you see?"),), task_name="looks", row={"seed": s}) for s in seeds]
