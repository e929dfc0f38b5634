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
    """Each add waits until the file named by the row's ``gate`` exists (a simulator step that
    takes as long as the test wants), so an actor can be killed mid-episode. The file is the
    event: the actor is another process. Without a ``gate`` column, adds answer at once."""

    def reset(self, gate: str | None = None, **row) -> str:
        self.gate = gate
        return super().reset(**row)

    async def add(self, n: int) -> str:
        """Add to the total, slowly.

        Args:
            n: How much to add.
        """
        for _ in range(GATE_POLLS):  # the bound only catches a gate the test never opened
            if self.gate is None or os.path.exists(self.gate):
                return super().add(n)
            await asyncio.sleep(0.01)
        raise TimeoutError(f"the gate file {self.gate} was never created")


#: How many times ``Slow.add`` looks for its gate file, 10 ms apart (60 s: a hang bound).
GATE_POLLS = 6000


class Broken(Counter):
    def reset(self, **row):
        raise RuntimeError("no simulator licence")


class LeakyClose(Counter):
    def close(self):
        raise OSError("simulator did not shut down")
