"""The figures in the page's header: every number the run recorded, the ones that matter first.

The page once showed the first 24 leaves of ``metrics.json`` in file order, so a second
environment's numbers and the wall time (written last) vanished. Now the header has no cap, and
its order is decided here, where it is tested, not in the page's JavaScript:

- a rollout: the headline figures (episodes, mean reward, wall time, generated tokens per second,
  error rate) first, then each environment's figures, then every other number of ``metrics.json``
  in its own order. ``generation_seconds`` and ``environment_seconds`` are sums over episodes,
  which run concurrently (1,134 s of generation in a 79 s rollout), and are labelled so;
- a training run: steps, optimizer updates (steps whose update ran at least one micro-batch:
  a step in which every group had equal rewards takes none), the mean reward (or SFT's loss) of
  the first and last steps, the time in steps, then every number of ``eval.json``.

Each item is ``[label, value]``; a value is a number or None.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: Rollout figures shown first, in this order, when present.
HEADLINE = ("episodes", "mean_total_reward", "wall_seconds", "generated_tokens_per_second", "error_rate")

#: Figures summed over concurrent episodes: their label says so, beside the rollout's wall time.
SUMMED = {
    "generation_seconds": "generation_seconds (sum over episodes)",
    "environment_seconds": "environment_seconds (sum over episodes)",
}


def header(kind: str, metrics: Any, curve: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The header's ``[label, value]`` items for a run of ``kind`` (see the module docstring)."""
    if kind == "training":
        return _training(curve) + [[k, v] for k, v in flatten(metrics)]
    items = flatten(metrics)
    first = [next(item for item in items if item[0] == key) for key in HEADLINE if key in dict(items)]
    tasks = [item for item in items if item[0].startswith("per_task.")]
    rest = [item for item in items if item not in first and item not in tasks]
    return [[SUMMED.get(k, k), v] for k, v in [*first, *tasks, *rest]]


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Every number (or None) under ``value``, with its dotted key, in the mapping's own order."""
    if not isinstance(value, Mapping):
        return []
    out: list[tuple[str, Any]] = []
    for key, item in value.items():
        if isinstance(item, Mapping):
            out += flatten(item, f"{prefix}{key}.")
        elif item is None or isinstance(item, (int, float)) and not isinstance(item, bool):
            out.append((f"{prefix}{key}", item))
    return out


def _training(curve: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    if not curve:
        return []
    key = "reward/mean" if any("reward/mean" in m for m in curve) else "loss"
    values = [m[key] for m in curve if m.get(key) is not None]
    items = [["steps", curve[-1].get("step")]]
    if any("micro_batches" in m for m in curve):
        items.append(["optimizer updates", sum(1 for m in curve if m.get("micro_batches"))])
    if values:
        items += [[f"{key} first", values[0]], [f"{key} last", values[-1]]]
    if any("time/step" in m for m in curve):
        items.append(["seconds in steps", sum(m.get("time/step", 0.0) for m in curve)])
    return items
