"""The end-of-run report: ``report.md`` (reward before and after, wall time, where the time went)
and ``reward_curve.png`` (mean reward per step, overall and per environment, with a moving
average). The PNG needs ``matplotlib`` (the ``train`` extra); without it the report says so."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Sequence

from .logbook import read_metrics


def write_report(out: Path, eval_before: dict | None = None, eval_after: dict | None = None, wall_seconds: float | None = None) -> Path:
    history = read_metrics(out / "metrics.jsonl")
    lines = ["# Training report", ""]
    if history:
        window = max(1, min(5, len(history) // 4 or 1))
        first = statistics.fmean(m["reward/mean"] for m in history[:window])
        last = statistics.fmean(m["reward/mean"] for m in history[-window:])
        lines += [
            f"- Steps: {history[-1]['step']}",
            f"- Training reward (mean of {window} step(s)): first {first:.3f} -> last {last:.3f}",
        ]
        for key in sorted({k for m in history for k in m if k.startswith("reward/env/")}):
            seq = [m[key] for m in history if m.get(key) is not None]
            if seq:
                w = max(1, min(window, len(seq)))
                lines.append(f"  - {key.removeprefix('reward/env/')}: {statistics.fmean(seq[:w]):.3f} -> {statistics.fmean(seq[-w:]):.3f}")
        split = {k: sum(m.get(f"time/{k}", 0.0) for m in history) for k in ("rollout", "update", "sync")}
        lines.append(
            "- Time in steps: " + ", ".join(f"{k} {v:.0f}s" for k, v in split.items())
            + f" (mean {statistics.fmean(m['time/step'] for m in history):.1f}s/step)"
        )
    if eval_before is not None and eval_after is not None:
        lines.append(
            f"- Held-out greedy evaluation ({eval_after['episodes']} episodes): mean reward "
            f"{eval_before['mean_reward']:.3f} before -> {eval_after['mean_reward']:.3f} after"
        )
        for task, value in eval_after["per_task"].items():
            lines.append(f"  - {task}: {eval_before['per_task'].get(task, float('nan')):.3f} -> {value:.3f}")
    if wall_seconds is not None:
        lines.append(f"- Wall time: {wall_seconds:.0f}s")
    png = plot_rewards(history, out / "reward_curve.png")
    lines += ["", f"![reward curve]({png.name})" if png else "(reward_curve.png needs matplotlib: pip install 'rollforge[train]')"]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def plot_rewards(history: Sequence[dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [m["step"] for m in history]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [m["reward/mean"] for m in history], color="black", alpha=0.35, label="mean reward")
    ax.plot(steps, _moving_average([m["reward/mean"] for m in history]), color="black", label="mean (moving avg)")
    for key in sorted({k for m in history for k in m if k.startswith("reward/env/")}):
        points = [(m["step"], m[key]) for m in history if m.get(key) is not None]
        ax.plot([p[0] for p in points], _moving_average([p[1] for p in points]), label=key.removeprefix("reward/env/"))
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _moving_average(values: Sequence[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
