"""What admission to training does to the batch, step by step: episodes started, finished and
admitted, compared by duration and by difficulty.

Asynchronous systems commonly admit whichever episodes finish first and drop those that became too
stale, which trains on fast, easy problems and starves slow, hard ones. The pipeline
(``recipes/grpo_async.py``) instead admits whole groups in the order they *started*, and starts a group only
where all its tokens can be trained within ``max_staleness`` versions: nothing is dropped for being
slow. What can still skew a step is reported, cumulatively over the run so far:

- ``admission/started``, ``finished``, ``admitted``, ``in_flight`` (started, not finished);
- ``admission/dropped`` and ``admission/dropped/<reason>``: episodes that reached the trainer but
  contribute nothing (``infra_failure``: excluded from its group's baseline; ``group_lost``: its
  group kept fewer than two members; ``stale``: every token older than the bound);
- ``admission/{admitted,finished}_duration_q1..q4``: the share of admitted episodes, and of all
  finished ones, in each quartile of episode duration (generation + environment seconds; the
  quartile edges are those of every finished episode). Equal shares: no bias toward fast episodes;
  the in-flight episodes, the slowest, are in neither until they finish;
- ``admission/{admitted,finished}_difficulty_q1..q4``: the same for groups, by the mean of their
  environment rewards (q1: the hardest), over groups whose episodes have all finished;
- ``admission/duration_bias`` and ``difficulty_bias``: the largest gap between the two shares.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections import Counter
from typing import Any, Sequence

from ..types import Trajectory


class AdmissionLedger:
    def __init__(self, group_size: int):
        self.group_size = group_size
        self.started = 0
        self.durations: dict[tuple[int, int], float] = {}  # (step, episode index) -> seconds, once finished
        self.groups: dict[tuple[int, int], list[float]] = {}  # (step, group) -> its finished episodes' env rewards
        self.admitted_episodes: list[tuple[int, int]] = []
        self.admitted_groups: list[tuple[int, int]] = []
        self.dropped: Counter[str] = Counter()

    def start(self, episodes: int) -> None:
        self.started += episodes

    def finish(self, step: int, trajectory: Trajectory) -> None:
        self.durations[step, trajectory.index] = trajectory.generation_seconds + trajectory.environment_seconds
        self.groups.setdefault((step, trajectory.index // self.group_size), []).append(trajectory.total_reward)

    def admit(self, step: int, trajectories: Sequence[Trajectory], dropped: dict[str, int]) -> dict[str, Any]:
        """Record a step's batch (and what of it contributes nothing, by reason); its metrics."""
        self.admitted_episodes += [(step, t.index) for t in trajectories]
        self.admitted_groups += sorted({(step, t.index // self.group_size) for t in trajectories})
        self.dropped.update({reason: n for reason, n in dropped.items() if n})
        out: dict[str, Any] = {
            "admission/started": self.started,
            "admission/finished": len(self.durations),
            "admission/admitted": len(self.admitted_episodes),
            "admission/in_flight": self.started - len(self.durations),
            "admission/dropped": sum(self.dropped.values()),
        }
        out.update({f"admission/dropped/{reason}": n for reason, n in sorted(self.dropped.items())})
        complete = {g: statistics.fmean(r) for g, r in self.groups.items() if len(r) == self.group_size}
        out.update(_shares("duration", self.durations, self.admitted_episodes))
        out.update(_shares("difficulty", complete, self.admitted_groups))
        return out


def _shares(name: str, values: dict[Any, float], admitted: Sequence[Any]) -> dict[str, float | None]:
    """Per quartile of ``values``: the share of all keys and of the ``admitted`` ones in it."""
    kept = [values[k] for k in admitted if k in values]
    if len(values) < 2 or not kept:
        return {f"admission/{name}_bias": None}
    edges = statistics.quantiles(values.values(), n=4, method="inclusive")
    every = Counter(min(bisect_right(edges, v), 3) for v in values.values())
    chosen = Counter(min(bisect_right(edges, v), 3) for v in kept)
    out: dict[str, float | None] = {}
    gaps = []
    for q in range(4):
        out[f"admission/admitted_{name}_q{q + 1}"] = a = chosen[q] / len(kept)
        out[f"admission/finished_{name}_q{q + 1}"] = f = every[q] / len(values)
        gaps.append(abs(a - f))
    out[f"admission/{name}_bias"] = max(gaps)
    return out
