"""The quickstart: a supervised warm-up on expert demonstrations, then GRPO from the warmed-up weights.

Untrained, a small model writes no valid tool call, so GRPO on a tool environment gets no reward
signal; the warm-up teaches the call format first. Three parts, each an existing piece:

1. held-out greedy evaluation of the base model on the GRPO run's own held-out prompts
   (``eval.json`` key ``before_warmup``);
2. the warm-up: ``sft`` (``sft.py``) on the warm-up config's sources, written to
   ``OUT/warmup/`` (its ``metrics.jsonl`` and final checkpoint);
3. GRPO: ``train`` (``launch.py``, ``grpo.py``) with ``model.name`` set to the warm-up checkpoint's
   ``model/`` directory, written to ``OUT/``; it evaluates the same held-out prompts before
   (``before``: after the warm-up) and after (``after``) its steps.

``report.md`` then shows both phases and the held-out reward per environment at the three points.
The presets (``presets/quickstart.yaml``: GRPO, ``presets/quickstart_warmup.yaml``: SFT) ship in
the wheel. With ``resume``, a base evaluation already in ``eval.json`` and a finished warm-up are reused, and
GRPO continues from its newest checkpoint.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import read_json
from ..train import checkpoint as ckpt
from ..train.config import LoraConfig, TrainConfig
from ..train.logbook import read_metrics
from ..train.report import held_out_curve, plot_held_out, write_report
from ..workers import run_sync
from .sft_config import SFTConfig

PRESETS = Path(__file__).resolve().parent / "presets"  # quickstart.yaml (GRPO), quickstart_warmup.yaml (SFT)


@dataclass(frozen=True)
class QuickstartResult:
    out: Path
    report: Path
    evaluations: dict[str, Any]  # "before_warmup", "before" (after the warm-up), "after" (after GRPO)
    seconds: dict[str, float]  # wall time of each phase run by this call: evaluation, warmup, grpo, total


def quickstart(
    config: TrainConfig, warmup: SFTConfig, *, resume: bool = False, overwrite: bool = False
) -> QuickstartResult:
    """Evaluate the base model, warm it up with ``warmup`` (its ``out`` and ``model`` are replaced
    by ``OUT/warmup`` and ``config.model``), then train ``config`` from the warmed-up weights.
    Without ``resume``, an ``OUT`` that holds a run already is refused, or with ``overwrite`` cleared."""
    from .launch import train
    from .sft import sft

    out = Path(config.out)
    if not resume:
        for directory in (out, out / "warmup"):
            ckpt.start_fresh(directory, overwrite)
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    evaluations = read_json(out / "eval.json")
    if config.eval_episodes and "before_warmup" not in evaluations:
        evaluations["before_warmup"] = run_sync(evaluate_base(config))
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(evaluations, indent=2) + "\n")
        seconds["evaluation"] = time.perf_counter() - began
    warm = out / "warmup"
    checkpoint = ckpt.latest_checkpoint(warm / "checkpoints") if resume else None
    if checkpoint is None:
        started = time.perf_counter()
        sft(
            warmup.model_copy(update={"out": str(warm), "model": config.model}), overwrite=True
        )  # an unfinished one starts over
        checkpoint = ckpt.latest_checkpoint(warm / "checkpoints")
        seconds["warmup"] = time.perf_counter() - started
    started = time.perf_counter()
    model = config.model.model_copy(update={"name": str(checkpoint / "model")})
    result = train(config.model_copy(update={"model": model}), resume=resume)
    seconds["grpo"] = time.perf_counter() - started
    seconds["total"] = time.perf_counter() - began
    report = write_quickstart_report(out, warm, result.evaluations, seconds)
    return QuickstartResult(out, report, result.evaluations, seconds)


async def evaluate_base(config: TrainConfig) -> dict[str, Any]:
    """Held-out greedy evaluation of ``config.model`` as it is, on the prompts ``train`` evaluates."""
    from ..chat.render import ChatRenderer
    from ..inputs.evaluate import evaluate
    from ..inputs.read import held_out, read_inputs, training_prompts
    from ..train.generation_backend import backend_config, shared_model
    from ..train.policy import load_policy

    model, tokenizer = load_policy(config.model, LoraConfig())
    model.requires_grad_(False)
    task_to_env, prompts = read_inputs(
        config.environments, held_out(training_prompts(config.data, config.seed), config.eval_episodes)
    )
    generation = backend_config(config.model, config.rollout, config.ray, "local", config.seed, False, config.vllm)
    greedy = config.rollout.model_copy(update={"greedy": True, "seed": config.seed})
    result = await evaluate(
        generation, prompts, task_to_env, ChatRenderer(tokenizer), greedy, hf_model=shared_model(generation, model)
    )
    return result.to_json()


def write_quickstart_report(out: Path, warm: Path, evaluations: dict[str, Any], seconds: dict[str, float]) -> Path:
    """``report.md``: the warm-up (steps, loss, time), GRPO (``write_report``'s lines and reward curve)
    and the held-out reward per environment before the warm-up, after it and after GRPO."""
    history = read_metrics(warm / "metrics.jsonl")
    lines = ["# Quickstart report", "", "## 1. Warm-up: supervised fine-tuning on expert demonstrations", ""]
    if history:
        lines += [
            f"- Steps: {history[-1]['step']} (batches of {history[0]['examples']} demonstrations); "
            f"loss {history[0]['loss']:.3f} (first step) -> {history[-1]['loss']:.3f} (last)",
            f"- Time in steps: {sum(m['time/step'] for m in history):.0f}s"
            + (f"; phase wall time {seconds['warmup']:.0f}s" if "warmup" in seconds else ""),
        ]
    grpo = [line for line in write_report(out).read_text().splitlines()[2:] if line]  # without its title
    lines += ["", "## 2. GRPO from the warmed-up weights", "", *grpo[:-1]]
    if "grpo" in seconds:
        lines.append(f"- Phase wall time: {seconds['grpo']:.0f}s")
    lines += ["", grpo[-1]]  # the reward curve
    lines += _held_out_lines(out, history, evaluations)
    points = [("before_warmup", "before warm-up"), ("before", "after warm-up"), ("after", "after GRPO")]
    shown = [(key, name) for key, name in points if key in evaluations]
    if shown:
        episodes = evaluations[shown[-1][0]]["episodes"]
        tasks = sorted({t for key, _ in shown for t in evaluations[key]["per_task"]})
        lines += [
            "",
            f"## Held-out greedy evaluation ({episodes} episodes): mean reward",
            "",
            "| environment | " + " | ".join(name for _, name in shown) + " |",
            "|---" * (len(shown) + 1) + "|",
        ]
        for task in [*tasks, "all"]:
            cells = [
                evaluations[key]["mean_reward"] if task == "all" else evaluations[key]["per_task"].get(task)
                for key, _ in shown
            ]
            lines.append(f"| {task} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells) + " |")
    if "total" in seconds:
        parts = ", ".join(f"{k} {v:.0f}s" for k, v in seconds.items() if k != "total")
        lines += ["", f"Total wall time: {seconds['total']:.0f}s ({parts})"]
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def _held_out_lines(out: Path, warmup: list[dict[str, Any]], evaluations: dict[str, Any]) -> list[str]:
    """``held_out_curve.png`` over both phases, on one axis of optimizer steps: the base model at 0,
    the warm-up's end at its step count W, GRPO's evaluations at W + their step."""
    if "before_warmup" not in evaluations or not warmup:
        return []
    width = warmup[-1]["step"]
    curve = [(0, evaluations["before_warmup"])] + [(width + step, r) for step, r in held_out_curve(evaluations)]
    png = plot_held_out(curve, out / "held_out_curve.png", phases=[(0, "warm-up"), (width, "GRPO")])
    return ["", f"![held-out greedy reward, both phases]({png.name})"] if png else []
