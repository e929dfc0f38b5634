"""The end-of-run report: ``report.md`` (steps and optimizer updates, reward before and after, wall
time, where the time went), ``reward_curve.png`` (mean training reward per step, overall and per
environment, with a moving average; an SFT run's loss), the lines a training command prints at its
end (``summary``) and, when ``eval.json`` holds evaluations during training (``eval_every``),
``held_out_curve.png`` (held-out greedy reward per step, overall and per environment). The PNGs need
``matplotlib`` (the ``train`` extra); without it the report says so."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Sequence

from .logbook import no_update_reason, read_metrics


def write_report(
    out: Path,
    eval_before: dict | None = None,
    eval_after: dict | None = None,
    wall_seconds: float | None = None,
    evaluations: dict | None = None,
) -> Path:
    history = read_metrics(out / "metrics.jsonl")
    lines = ["# Training report", ""]
    if history:
        window = max(1, min(5, len(history) // 4 or 1))
        rewards = [m["reward/mean"] for m in history if m.get("reward/mean") is not None]  # None: all failed
        lines.append(f"- Steps: {history[-1]['step']} ({_updates(history)} optimizer updates)")
        if rewards:
            window = min(window, len(rewards))
            lines.append(
                f"- Training reward (mean of {window} step(s)): first {statistics.fmean(rewards[:window]):.3f} "
                f"-> last {statistics.fmean(rewards[-window:]):.3f}"
            )
        for key in sorted({k for m in history for k in m if k.startswith("reward/env/")}):
            seq = [m[key] for m in history if m.get(key) is not None]
            if seq:
                w = max(1, min(window, len(seq)))
                lines.append(
                    f"  - {key.removeprefix('reward/env/')}: {statistics.fmean(seq[:w]):.3f} -> {statistics.fmean(seq[-w:]):.3f}"
                )
        split = {k: sum(m.get(f"time/{k}", 0.0) for m in history) for k in ("rollout", "update", "sync")}
        lines.append(
            "- Time in steps: "
            + ", ".join(f"{k} {v:.0f}s" for k, v in split.items())
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
    lines += [
        "",
        f"![reward curve]({png.name})"
        if png
        else "(reward_curve.png needs matplotlib: pip install 'rollforge[train]')",
    ]
    curve = held_out_curve(evaluations or {})
    if len(curve) > 2 and (held := plot_held_out(curve, out / "held_out_curve.png")):
        lines += ["", f"![held-out greedy reward]({held.name})"]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def summary(
    history: Sequence[dict[str, Any]],
    out: Path,
    *,
    since: int = 0,
    wall_seconds: float | None = None,
    verb: str = "trained",
) -> str:
    """What a training command prints at its end, about the steps after ``since`` (a resumed run's
    checkpoint): how many steps and optimizer updates (a step without one says why), the mean
    reward (SFT: the loss) of its first and last steps, the wall time, and where the run is."""
    steps = [m for m in history if m.get("step", 0) > since]
    where = f"run: {out} (rollforge view {out})"
    if not steps:
        return f"no step was {verb}; {where}"
    updates = _updates(steps)
    lines = [
        f"{verb} {_count(len(steps), 'step')} ({steps[0]['step']}-{steps[-1]['step']}), "
        f"{_count(updates, 'optimizer update')}"
    ]
    skipped = [m for m in steps if m.get("micro_batches") == 0]
    if skipped:
        reasons = sorted({no_update_reason(m) for m in skipped})
        lines[0] += f" (no update in {_count(len(skipped), 'step')}: {'; '.join(reasons)})"
    key = "reward/mean" if any("reward/mean" in m for m in steps) else "loss"
    values = [(m["step"], m[key]) for m in steps if m.get(key) is not None]
    if values:
        (a, first), (b, last) = values[0], values[-1]
        lines.append(f"{key} {first:.3f} (step {a}) -> {last:.3f} (step {b})")
    if wall_seconds is not None:
        lines.append(f"wall time {wall_seconds:.0f}s")
    return "; ".join(lines) + f"\n{where}"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _updates(history: Sequence[dict[str, Any]]) -> int:
    """Steps whose update took an optimizer step (a step that ran no micro-batch took none)."""
    return sum(1 for m in history if m.get("micro_batches", 1) != 0)


def plot_rewards(history: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Mean training reward per step with its moving average, and each environment's moving
    average; an SFT run (no reward) plots its loss instead. None without matplotlib or a point."""
    plt = _pyplot()
    key = "reward/mean" if any(m.get("reward/mean") is not None for m in history) else "loss"
    points = [(m["step"], m[key]) for m in history if m.get(key) is not None]
    if plt is None or not points:
        return None
    steps, values = [p[0] for p in points], [p[1] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, values, color="black", alpha=0.35, label=f"{key}")
    ax.plot(steps, _moving_average(values), color="black", label=f"{key} (moving avg)")
    for key in sorted({k for m in history for k in m if k.startswith("reward/env/")}):
        points = [(m["step"], m[key]) for m in history if m.get(key) is not None]
        ax.plot([p[0] for p in points], _moving_average([p[1] for p in points]), label=key.removeprefix("reward/env/"))
    return _save(plt, fig, ax, "reward" if key == "reward/mean" else "loss", path)


def _moving_average(values: Sequence[float], window: int = 5) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]


def held_out_curve(evaluations: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """``eval.json``'s evaluations of one run in step order: ``before`` and ``after`` at their weight
    versions, ``step-N`` after step N (other keys, such as the quickstart's ``before_warmup``, are not
    points of this run's curve)."""
    points = []
    for key, result in evaluations.items():
        if key in ("before", "after"):
            points.append((int(result.get("weight_version", 0)), result))
        elif key.startswith("step-") and key[5:].isdigit():
            points.append((int(key[5:]), result))
    return sorted(points, key=lambda point: point[0])


def plot_held_out(
    curve: Sequence[tuple[int, dict[str, Any]]], path: Path, phases: Sequence[tuple[int, str]] = ()
) -> Path | None:
    """The held-out curve; ``phases``: (first step, name) of each phase, marked on the step axis."""
    plt = _pyplot()
    if plt is None:
        return None
    steps = [step for step, _ in curve]
    fig, ax = plt.subplots(figsize=(7, 4))
    for start, name in phases:
        ax.axvline(start, color="grey", linestyle=":")
        ax.annotate(name, (start, 1.0), xytext=(3, -12), textcoords="offset points", color="grey")
    ax.plot(steps, [r["mean_reward"] for _, r in curve], color="black", marker="o", label="held-out mean (greedy)")
    for task in sorted({t for _, r in curve for t in r.get("per_task", {})}):
        points = [(step, r["per_task"][task]) for step, r in curve if task in r.get("per_task", {})]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=task)
    return _save(plt, fig, ax, "held-out reward", path)


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(plt: Any, fig: Any, ax: Any, ylabel: str, path: Path) -> Path:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
