"""Dynamic sampling (DAPO, Yu et al. 2025): a step trains only on groups whose rewards differ.

A GRPO group whose members all earned the same reward has zero advantage: it costs a rollout and
gives no gradient, and the more of a batch such groups are (prompts the policy always solves, or
never), the smaller the batch that learns. DAPO over-samples and filters them out: ``fill`` rolls
out rounds of prompts, keeps the groups with reward variance (``varied_groups``) and draws again
until ``batch_size`` groups are kept. ``Scored`` is what a round (and the step) hands on: its
episodes with their rewards, so that nothing is scored twice.

Choices made:

- Variance is judged over a group's known rewards (``known``): infrastructure failures and rewards
  a reward service could not compute (unknown, left out of the baseline by ``advantages.py``) do
  not count, and a group with fewer than two known members is dropped with the flat ones (it could
  have no baseline).
- Round sizes: the first round draws ``batch_size`` prompts; each later one what is missing,
  scaled by the share of groups kept so far in the step (a small over-draw), at most
  ``batch_size``: ceil(missing * drawn / kept), or ``batch_size`` while none was kept.
- Bounded: at most ``max_rounds`` rounds, the first included. When they are spent the step trains
  on the groups kept so far, fewer than ``batch_size`` (``sampling/short`` says how many fewer).
  A step that kept none trains on its first round, as a step without dynamic sampling would: every
  group is flat, so its advantages are 0 and (unless a KL term or ``skip_zero_advantage: false``
  asks to forward them) no optimizer step is taken.
- Exactly ``batch_size`` groups train at most: the kept groups in the order drawn; the rest of the
  last round's kept groups are discarded and counted (``sampling/groups_surplus``), so
  ``groups_drawn = groups_dropped + groups_kept + groups_surplus``.
- Seeds: a round's episodes take the episode indices after those already drawn in the step
  (``first``), so every episode of a step has its own sampling seeds, the first round's are those
  of a step without dynamic sampling, and a rerun (or a resumed run) repeats the same draws. The
  prompt source advances over every prompt drawn, so a checkpoint resumes after the last round.
- Metrics: the rollout metrics cover every episode generated in the step (``join``); the reward,
  advantage and update metrics, and the saved trajectories, the trained groups only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from ..rollout.metrics import rollout_metrics
from ..types import Sample, Trajectory
from ..inputs.rewards import Rewards


@dataclass(frozen=True, repr=False)
class Scored:
    """Rolled-out episodes (``group_size`` consecutive ones per prompt) with their rewards."""

    trajectories: tuple[Trajectory, ...]
    rewards: Rewards
    rollout: dict[str, Any]  # the engine's metrics, over every episode generated for this batch
    times: dict[str, float]  # seconds by phase (``rollout``, ``score``), summed over rounds

    def __repr__(self) -> str:  # short: trajectories are big
        return f"Scored({len(self.trajectories)} episodes)"


@dataclass(frozen=True)
class SamplingStats:
    """What a step's dynamic sampling drew and kept, in groups (prompts)."""

    rounds: int
    groups_drawn: int
    groups_dropped: int  # no reward variance among their known members
    groups_kept: int  # trained
    groups_surplus: int  # with variance, but beyond batch_size

    def metrics(self, batch_size: int) -> dict[str, int]:
        """The ``sampling/*`` keys of the step's metrics line."""
        return {
            "sampling/rounds": self.rounds,
            "sampling/groups_drawn": self.groups_drawn,
            "sampling/groups_dropped": self.groups_dropped,
            "sampling/groups_kept": self.groups_kept,
            "sampling/groups_surplus": self.groups_surplus,
            "sampling/short": batch_size - self.groups_kept,
        }


def known(trajectories: Sequence[Trajectory], rewards: Rewards | None = None) -> list[bool]:
    """Whether each episode's reward is known: not an infrastructure failure (its reward is unknown,
    not 0), nor one whose reward a reward service could not compute (``rewards.unavailable``)."""
    missing = rewards.unavailable if rewards is not None else {}
    return [t.outcome != "infra_failure" and i not in missing for i, t in enumerate(trajectories)]


def varied_groups(totals: Sequence[float], group_size: int, keep: Sequence[bool] | None = None) -> list[bool]:
    """Per group of ``group_size`` consecutive totals: whether its kept members' rewards (``keep``,
    None: all) are not all equal; a group with fewer than two kept members has no variance."""
    keep = [True] * len(totals) if keep is None else list(keep)
    out = []
    for first in range(0, len(totals), group_size):
        values = [r for r, k in zip(totals[first : first + group_size], keep[first : first + group_size]) if k]
        out.append(len(values) >= 2 and max(values) != min(values))
    return out


def round_size(missing: int, drawn: int, kept: int, batch_size: int) -> int:
    """Prompts the next round draws for ``missing`` groups, given ``kept`` of the ``drawn`` groups
    so far had variance: ceil(missing * drawn / kept), at most ``batch_size`` (which is also the
    size while nothing was kept)."""
    if kept == 0:
        return batch_size
    return min(batch_size, math.ceil(missing * drawn / kept))


def take(scored: Scored, groups: Sequence[int], group_size: int) -> Scored:
    """The episodes of ``groups`` (indices, in that order) with their rewards; rollout metrics and
    times stay those of the whole."""
    rows = [g * group_size + i for g in groups for i in range(group_size)]
    rewards, moved = scored.rewards, {old: new for new, old in enumerate(rows)}
    picked = Rewards(
        [rewards.totals[r] for r in rows],
        {name: [values[r] for r in rows] for name, values in rewards.per_function.items()},
        rewards.errors,
        {moved[i]: why for i, why in rewards.unavailable.items() if i in moved},
    )
    return Scored(tuple(scored.trajectories[r] for r in rows), picked, scored.rollout, scored.times)


def join(parts: Sequence[Scored]) -> Scored:
    """The rounds as one batch, in order: episodes and rewards concatenate, reward-function errors
    unite, times add up, and the rollout metrics are recomputed over every episode (``wall_seconds``
    and ``on_episode_errors`` summed; other engine figures, such as ``abandoned_worker_calls``, the
    last round's)."""
    if len(parts) == 1:
        return parts[0]
    trajectories = tuple(t for p in parts for t in p.trajectories)
    names = parts[0].rewards.per_function
    starts = [sum(len(p.trajectories) for p in parts[:n]) for n in range(len(parts))]
    rewards = Rewards(
        [r for p in parts for r in p.rewards.totals],
        {name: [v for p in parts for v in p.rewards.per_function[name]] for name in names},
        {k: v for p in parts for k, v in p.rewards.errors.items()},
        {start + i: why for p, start in zip(parts, starts) for i, why in p.rewards.unavailable.items()},
    )
    walls = [p.rollout.get("wall_seconds") for p in parts]
    rollout = {
        **parts[-1].rollout,
        **rollout_metrics(trajectories, sum(walls) if None not in walls else None),
        "on_episode_errors": sum(p.rollout.get("on_episode_errors", 0) for p in parts),
    }
    times: dict[str, float] = {}
    for p in parts:
        for phase, seconds in p.times.items():
            times[phase] = times.get(phase, 0.0) + seconds
    return Scored(trajectories, rewards, rollout, times)


async def fill(
    draw: Callable[[int], list[Sample]],
    roll: Callable[[list[Sample], int], Awaitable[Scored]],
    *,
    batch_size: int,
    group_size: int,
    max_rounds: int,
) -> tuple[Scored, SamplingStats]:
    """Up to ``batch_size`` groups with reward variance, from at most ``max_rounds`` rounds (see the
    module docstring). ``draw(n)``: the next ``n`` prompts, each ``group_size`` times in a row;
    ``roll(samples, first)``: them rolled out and scored, their episode indices starting at ``first``."""
    rounds: list[Scored] = []
    chosen: list[int] = []  # groups with variance, indices into the rounds joined
    drawn = dropped = episodes = 0
    while len(rounds) < max_rounds and len(chosen) < batch_size:
        samples = draw(round_size(batch_size - len(chosen), drawn, len(chosen), batch_size))
        scored = await roll(samples, episodes)
        varied = varied_groups(scored.rewards.totals, group_size, known(scored.trajectories, scored.rewards))
        chosen += [drawn + g for g, v in enumerate(varied) if v]
        dropped += varied.count(False)
        drawn += len(varied)
        episodes += len(samples)
        rounds.append(scored)
    kept = min(len(chosen), batch_size)
    stats = SamplingStats(len(rounds), drawn, dropped, kept, len(chosen) - kept)
    return take(join(rounds), chosen[:kept] or range(batch_size), group_size), stats  # none kept: the first round
