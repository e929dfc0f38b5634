"""A TRL-style environment class for examples/custom_env.yaml: reach a target with add(n)."""


class Counter:
    def reset(self, start: int = 0, target: int = 5, **row) -> str:
        self.total, self.target = start, target
        self.done = False
        return f"The counter is at {start}. Reach exactly {target}."

    def add(self, n: int) -> str:
        """Add to the counter.

        Args:
            n: How much to add (may be negative).
        """
        self.total += n
        self.done = self.total == self.target
        return f"total={self.total}"

    def get_reward(self) -> float:
        return float(self.total == self.target)
