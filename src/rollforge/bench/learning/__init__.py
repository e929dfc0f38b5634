"""``rollforge bench learning``: held-out reward per step and per wall second, rollforge vs TRL.

Both trainers start from the same warm-up checkpoint and train on the ``calculator`` workload of
``vs_trl.workloads`` (the bundled two-turn environment on the quickstart's operations; its class is
TRL's ``environment_factory``) with the settings of ``vs_trl`` (same completions per step, token
limits, DAPO/token loss, optimizer) and the quickstart's GRPO preset
(``recipes/presets/quickstart.yaml``: batch size, group size, lr, per-turn tokens, turns, dtype,
operations; flags override).

- Prompts: the preset's (``balanced``: every block of four questions asks both operations, with
  operands that make each tool the right one once), read in order on both sides (``data.shuffle``
  false; TRL's ``shuffle_dataset=False``), so that step s trains on the same questions on both.
- One process per side (``learning.sides``), one after the other: the warm-up, then rollforge, then
  TRL, each loading the checkpoint afresh; each reports its peak memory (``max_rss_mb``).
- The warm-up: rollforge's SFT on the calculator expert's demonstrations (closing reply included)
  with the quickstart's warm-up preset (``recipes/presets/quickstart_warmup.yaml``); or ``--warmup DIR`` made under the
  same template (``check_warmup``: the quickstart's own warm-up is refused). The model directory
  both trainers load carries TRL's Qwen2.5 chat template: TRL parses tool calls only for templates
  it knows, and SmolLM2's ChatML template renders no tools.
- The episode ends the same way on both sides: compute, ``answer``, then a reply without a tool
  call (the calculator's ``closing`` rows: ``answer`` does not end the episode). TRL's tool loop
  generates one more turn after the last tool result; rollforge runs the preset's ``max_turns``
  plus that closing turn, and TRL as many tool-call rounds as the preset's turns
  (``max_tool_calling_iterations``), after which it generates the closing turn. The warm-up teaches
  the whole episode, closing reply included. An episode's token budget on both sides (TRL's
  ``max_completion_length``, rollforge's ``max_seq_len`` less the prompt) is ``max_new_tokens``
  per generated turn: ``(max_turns + 1) * max_new_tokens``. Both sample the full softmax at
  temperature 1 (``settings.sampling``).
- Held-out reward: the same ``eval_episodes`` calculator questions (a seed no training row uses),
  answered greedily, scored by rollforge's evaluator (``aevaluate``) on both sides: on rollforge's
  own backend, and on an HF backend over TRL's model. Every ``eval_every`` steps and after the last,
  outside the step clock; step 0 (the warm-up) is evaluated once, for both.
- Wall time of a curve point: the sum of that side's step times up to it (model loading and
  evaluation excluded). ``ratio_time_to_target``: rollforge's wall time to first reach the held-out
  reward TRL ends with, over TRL's; None when rollforge never reaches it or TRL ends no higher than
  where it started (``ratio_note`` says which). ``ratio_time_to_target_below``: when TRL never
  reaches the reward rollforge ends with, rollforge's time to reach it over TRL's whole run, a bound
  the ratio is under (TRL may reach it later); else None.

Defaults, sized for at most 20 minutes on 2 idle CPU cores: SmolLM2-135M, the preset's batch size,
group size, lr, tokens per turn, turns and dtype (as written: 4 prompts x 8 completions, 2e-5, 48,
2, float32 on CPU; bfloat16 would mean autocast on both sides); 4 GRPO steps per side, 16 held-out questions
every 2 steps; TRL's loss forwards 8 completions at a time (``--trl-micro-batch``), about
rollforge's 4096-token micro-batches.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .settings import LearningSettings

#: Both sides sample the full softmax at temperature 1 (``vs_trl.runners`` sets and records it).
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": None, "repetition_penalty": 1.0}
STEPS, EVAL_EVERY, EVAL_EPISODES = 4, 2, 16
#: TRL's completions per loss forward (about rollforge's 4096-token micro-batches here): all 32 at
#: once would hold some 20k tokens' activations; one generation and one optimizer step per step still.
TRL_MICRO_BATCH = 8


def preset() -> dict[str, Any]:
    """The settings this bench takes from the quickstart's GRPO preset."""
    from ...recipes.quickstart import PRESETS
    from ...train.config import load_config

    config = load_config(PRESETS / "quickstart.yaml")
    calculator = next((e for e in config.environments if e.name == "calculator"), None)
    options = calculator.options if calculator else {}
    return {
        "batch_size": config.algorithm.batch_size,
        "generations": config.algorithm.group_size,
        "lr": config.optim.lr,
        "max_new_tokens": config.rollout.max_new_tokens,
        "max_turns": config.rollout.max_turns,
        "dtype": "bfloat16" if config.model.dtype == "bfloat16" else "float32",  # auto: float32 on CPU
        "operations": list(options.get("operations", ["plus", "times"])),
        "balanced": bool(options.get("balanced", False)),
        "shuffle": config.data.shuffle,
    }


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--model", default="smollm2-135m", help="base model the warm-up starts from (default smollm2-135m)"
    )
    parser.add_argument(
        "--warmup",
        default=None,
        metavar="DIR",
        help="a warm-up checkpoint's model dir made under the bench's chat template (TRL's "
        "Qwen2.5; the quickstart's is refused) instead of building one",
    )
    parser.add_argument("--steps", type=int, default=STEPS, help=f"GRPO steps per side (default {STEPS})")
    for flag, what in (
        ("--batch-size", "prompts per step"),
        ("--generations", "completions per prompt"),
        ("--max-new-tokens", "tokens per turn"),
    ):
        parser.add_argument(flag, type=int, default=None, help=f"{what} (default: the quickstart preset's)")
    parser.add_argument("--lr", type=float, default=None, help="default: the quickstart preset's")
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        default=TRL_MICRO_BATCH,
        help=f"TRL's completions per loss forward (default {TRL_MICRO_BATCH}; a divisor of the step's)",
    )
    parser.add_argument(
        "--eval-every", type=int, default=EVAL_EVERY, help=f"steps between held-out evaluations (default {EVAL_EVERY})"
    )
    parser.add_argument(
        "--eval-episodes", type=int, default=EVAL_EPISODES, help=f"held-out questions (default {EVAL_EPISODES})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for result.json and learning_curves.png")


def main(args: Any) -> dict[str, Any]:
    given = {
        "batch_size": args.batch_size,
        "generations": args.generations,
        "max_new_tokens": args.max_new_tokens,
        "lr": args.lr,
    }
    settings = {
        **preset(),
        **{k: v for k, v in given.items() if v is not None},
        "steps": args.steps,
        "seed": args.seed,
        "rollforge_mode": "async",
        "trl_micro_batch": args.trl_micro_batch,
        "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes,
    }
    return run(args.model, settings, warmup=args.warmup, out=args.out)


def run(model: str, settings: dict[str, Any], warmup: str | None = None, out: str | None = None) -> dict[str, Any]:
    """Warm-up, rollforge, TRL, each in its own process (``learning.sides.spawn``); the report."""
    from ..vs_trl import check_trl
    from .sides import check_warmup, spawn

    check_trl()
    if warmup is not None:
        check_warmup(Path(warmup))
    for key in (
        "steps",
        "eval_every",
        "eval_episodes",
        "batch_size",
        "generations",
        "max_new_tokens",
        "max_turns",
        "trl_micro_batch",
    ):
        if settings.get(key, 1) < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be at least 1, got {settings[key]}")
    turns = settings["max_turns"] + 1  # the preset's tool turns, then the closing reply
    chosen = LearningSettings.from_json(
        {
            "trl_micro_batch": TRL_MICRO_BATCH,
            **settings,
            "max_tool_calls": settings["max_turns"],
            "max_turns": turns,
            "max_completion_tokens": turns * settings["max_new_tokens"],
        }
    )
    with tempfile.TemporaryDirectory(prefix="rollforge-bench-learning-") as scratch:
        spec = {"model": model, "warmup": warmup, "settings": chosen.to_json(), "scratch": scratch}
        start = spawn("warmup", spec, Path(scratch))
        spec["model_dir"] = start["model_dir"]
        sides = {side: spawn(side, spec, Path(scratch)) for side in ("rollforge", "trl")}
    points = {side: {0: start["reward"], **{int(k): v for k, v in sides[side]["points"].items()}} for side in sides}
    result = report(chosen, {side: sides[side]["run"] for side in ("trl", "rollforge")}, points)
    result["max_rss_mb"] = {side: done["max_rss_mb"] for side, done in (("warmup", start), *sides.items())}
    result["settings"].update(
        model=model,
        warmup_seconds=start["seconds"],
        warmup=warmup or "built: SFT on calculator expert demonstrations (presets/quickstart_warmup.yaml)",
    )
    if out is not None:
        write(Path(out), result)
    return result


# -- the report ------------------------------------------------------------------------------------


def report(
    settings: LearningSettings, runs: dict[str, dict[str, Any]], points: dict[str, dict[int, float]]
) -> dict[str, Any]:
    curves = {side: curve(runs[side]["step_seconds"], points[side]) for side in runs}
    ratio, note = time_to_target_ratio(curves["rollforge"], curves["trl"])
    result: dict[str, Any] = {
        "benchmark": "learning",
        "ratio_time_to_target": ratio,
        "ratio_note": note,
        "ratio_time_to_target_below": time_to_target_bound(curves["rollforge"], curves["trl"]),
        "held_out_curves": curves,
        "settings": {
            **settings.to_json(),
            "workload": "calculator",
            "sampling": SAMPLING,
            "completions_per_step": settings.run.completions,
        },
    }
    for side, run in runs.items():
        first, last = curves[side][0]["reward"], curves[side][-1]["reward"]
        result[side] = {
            "held_out_start": first,
            "held_out_end": last,
            "held_out_gain_per_step": round((last - first) / settings.run.steps, 4),
            "train_seconds": round(sum(run["step_seconds"]), 2),
            "seconds_per_step": round(sum(run["step_seconds"]) / settings.run.steps, 3),
            "phases_per_step": mean_phases(run["steps"]),
            "generated_tokens_per_step": round(sum(x["generated_tokens"] for x in run["steps"]) / len(run["steps"]), 1),
            "train_reward_per_step": run["rewards"],
            "sampling": run["configuration"]["sampling"],
            "prompt_tokens": run["prompt_tokens"],  # the first row's prompt, tools included, as that side renders it
        }
    result["notes"] = [
        "wall seconds = the sum of that side's step times (generation, rewards, loss, optimizer; rollforge also "
        "its weight sync); model loading and held-out evaluation are outside them",
        "the episode ends the same way on both sides: compute, answer, then a reply without a tool call (TRL's "
        "loop generates that turn after the last tool result; rollforge's closing calculator rows wait for it). "
        "Calls after `answer` get 'the episode is over' and change nothing, so the reward is the answer's",
        "one process per side, one after the other (warm-up, rollforge, TRL): load on the machine may differ "
        "between them; max_rss_mb is each process's peak resident memory",
    ]
    return result


def mean_phases(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per step in generation (with the environment), update and other (``vs_trl.runners``)."""
    return {key: round(sum(x["phases"][key] for x in steps) / len(steps), 2) for key in steps[0]["phases"]}


def curve(step_seconds: list[float], points: dict[int, float]) -> list[dict[str, float]]:
    """``[{step, seconds, reward}]`` at the evaluated steps; ``seconds`` summed up to that step."""
    return [
        {"step": step, "seconds": round(sum(step_seconds[:step]), 2), "reward": points[step]} for step in sorted(points)
    ]


def time_to_target(points: list[dict[str, float]], target: float) -> float | None:
    return next((p["seconds"] for p in points if p["reward"] >= target), None)


def time_to_target_ratio(rollforge: list[dict[str, float]], trl: list[dict[str, float]]) -> tuple[float | None, str]:
    target = trl[-1]["reward"]
    if target <= trl[0]["reward"]:
        return None, f"TRL ends at held-out reward {target}, no higher than the warm-up's {trl[0]['reward']}: no target"
    ours, theirs = time_to_target(rollforge, target), time_to_target(trl, target)
    if ours is None:
        return (
            None,
            f"rollforge did not reach TRL's final held-out reward {target} (it ended at {rollforge[-1]['reward']})",
        )
    return round(ours / theirs, 4), f"target: TRL's final held-out reward {target}; rollforge {ours}s, TRL {theirs}s"


def time_to_target_bound(rollforge: list[dict[str, float]], trl: list[dict[str, float]]) -> float | None:
    """When TRL never reaches the held-out reward rollforge ends with (above where both started),
    the ratio is below rollforge's time to reach it over TRL's whole run: that bound; else None."""
    target = rollforge[-1]["reward"]
    if target <= rollforge[0]["reward"] or max(p["reward"] for p in trl) >= target or not trl[-1]["seconds"]:
        return None
    return round(time_to_target(rollforge, target) / trl[-1]["seconds"], 4)


def write(out: Path, result: dict[str, Any]) -> None:
    """``result.json`` and ``learning_curves.png`` (held-out reward per step and per wall second)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for side, color in (("trl", "tab:orange"), ("rollforge", "tab:blue")):
        points = result["held_out_curves"][side]
        for ax, key in zip(axes, ("step", "seconds")):
            ax.plot([p[key] for p in points], [p["reward"] for p in points], color=color, marker="o", label=side)
    axes[0].set_xlabel("step")
    axes[1].set_xlabel("wall seconds (training steps only)")
    axes[0].set_ylabel("held-out greedy reward")
    ratio = result["ratio_time_to_target"]
    fig.suptitle(
        f"calculator, {result['settings']['completions_per_step']} completions/step; "
        f"ratio_time_to_target {ratio if ratio is not None else 'None (' + result['ratio_note'] + ')'}",
        fontsize=9,
    )
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)
