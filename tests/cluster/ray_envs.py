"""Environment classes the Ray tests ship to actors. Kept apart from the test modules so that an
actor unpickling them imports this small module, not the tests' heavy imports."""

from __future__ import annotations

import asyncio
import os


class Counter:
    """Adds numbers; the reward is 1 when the total reaches 3. Records the actor's pid."""

    def reset(self, **row) -> str:
        self.total, self.pid = 0, os.getpid()
        return "Reach 3."

    def add(self, n: int) -> str:
        """Add to the total.

        Args:
            n: How much to add.
        """
        self.total += n
        return f"total={self.total}"

    def get_reward(self) -> float:
        return float(self.total == 3)


class Slow(Counter):
    """Each add takes a while (a simulator step), so an actor can be killed mid-episode."""

    async def add(self, n: int) -> str:
        """Add to the total, slowly.

        Args:
            n: How much to add.
        """
        await asyncio.sleep(0.4)
        return super().add(n)


class Broken(Counter):
    def reset(self, **row):
        raise RuntimeError("no simulator licence")


class LeakyClose(Counter):
    def close(self):
        raise OSError("simulator did not shut down")
