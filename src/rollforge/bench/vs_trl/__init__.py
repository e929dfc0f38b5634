"""``rollforge bench vs-trl``: seconds per GRPO step of rollforge's trainer vs TRL's ``GRPOTrainer``.

Both trainers train the same model on the same prompt rows with the same algorithm (see
``workloads`` for the two workloads; the default, ``arithmetic``, is SmolLM2-135M on
single-turn one-digit additions): ``batch_size`` prompts x ``generations`` completions per step,
so both generate the same number of completions (TRL's ``per_device_train_batch_size`` counts
completions: it is set to the product), one optimizer step per batch, group-normalised
advantages, token-level clipped loss (DAPO aggregation: TRL's ``loss_type="dapo"``, rollforge's
``loss_aggregation: token``), no KL, AdamW with the same learning rate and betas, constant schedule,
gradient norm clipped at 1, temperature 1, fp32 on CPU, no gradient checkpointing. Token limits:
``max_completion_tokens`` new tokens per completion (TRL ``max_completion_length``; rollforge
``max_new_tokens``, and ``max_seq_len`` = the longest prompt + that); with tools (``guess-number``)
each episode may call them ``max_tool_calls`` times (TRL ``max_tool_calling_iterations``; rollforge
``max_turns`` = calls + 1) within that token budget, tool results included.

Timing: a step is TRL's ``on_step_begin`` -> ``on_step_end`` (generation, rewards, loss, optimizer)
and rollforge's ``time/step`` (rollout, rewards, update, weight sync); neither includes logging.
Each side's step is split into generation, update and other (``vs_trl.runners`` says exactly what
each covers). The two trainers run in this process at the same time but take strictly alternating
steps (``vs_trl.runners.Turns``), so that load from other processes on a shared machine falls on
both alike. The first step of every run is a warm-up and is not timed; ``--rounds`` repeats the whole
pair of runs. ``ratio_step_time`` is rollforge's mean timed step over TRL's. ``--backend`` and
``--max-staleness`` choose rollforge's side (with ``--max-staleness`` >= 1 the two run one after the
other instead: the asynchronous loop generates between its steps). ``--best`` also measures each
side's fastest configuration (``vs_trl.best``): ``ratio_step_time_best``. Learning curves are the
mean reward of every step of each run; with ``--out`` they are also written as JSON and a PNG.

The package: this entry (flags, the run, the summary), ``settings`` (the frozen ``Settings`` both
sides read), ``runners`` (rollforge's side and the alternation), ``trl_side``, ``best``,
``workloads`` with the tool game's ``env`` and its tiny ``model``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .best import CANDIDATES, DEFAULT_BEST_STEPS, parse_candidates, run_best
from .env import QWEN25_TEMPLATE
from .runners import run_alternating, run_rollforge
from .settings import Settings
from .trl_side import run_trl
from .workloads import DEFAULTS, Workload, arithmetic, guess_number

PHASES = ("generation", "update", "other")


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--workload",
        choices=sorted(DEFAULTS),
        default="arithmetic",
        help="arithmetic: SmolLM2-135M, single-turn additions (default); guess-number: a 0.9M "
        "tool-calling model, multi-turn",
    )
    parser.add_argument(
        "--model", default="smollm2-135m", help="the arithmetic workload's model (default smollm2-135m)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per run, the first one untimed (default 6; 8 for guess-number)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs of each trainer (default 1)")
    parser.add_argument("--batch-size", type=int, default=None, help="prompts per step (default 2; 4 for guess-number)")
    parser.add_argument(
        "--generations", type=int, default=None, help="completions per prompt, the GRPO group (default 4)"
    )
    parser.add_argument("--max-completion-tokens", type=int, default=None, help="default 32; 128 for guess-number")
    parser.add_argument("--max-tool-calls", type=int, default=None, help="guess-number only (default 4)")
    parser.add_argument("--lr", type=float, default=None, help="default 1e-6; 5e-4 for guess-number")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rollforge-mode",
        choices=["async", "lockstep"],
        default="async",
        help="rollforge's rollout mode (default async)",
    )
    parser.add_argument(
        "--backend",
        choices=["hf", "vllm"],
        default="hf",
        help="rollforge's generation backend: hf (the trained model) or vllm (in-process engine)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="rollforge's algorithm.max_staleness: 0 synchronous (default), k >= 1 asynchronous",
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help="also time each side's candidate configurations and compare the fastest of each",
    )
    parser.add_argument(
        "--best-steps",
        type=int,
        default=None,
        help=f"steps per candidate with --best, the first untimed (default {DEFAULT_BEST_STEPS})",
    )
    parser.add_argument("--candidates", default=None, help=f"with --best (default all): {', '.join(CANDIDATES)}")
    parser.add_argument("--sides", default="trl,rollforge", help="comma-separated subset (for profiling one side)")
    parser.add_argument("--out", default=None, help="directory for result.json and learning_curves.png")


def main(args: Any) -> dict[str, Any]:
    workload = arithmetic(args.model, seed=args.seed) if args.workload == "arithmetic" else guess_number(args.seed)
    return run(workload, settings_from(args), sides=tuple(args.sides.split(",")), out=args.out)


def settings_from(args: Any) -> Settings:
    """The run's settings: the flags given, the workload's defaults for the others."""
    if args.workload == "arithmetic" and args.max_tool_calls:
        raise ConfigError(
            f"--max-tool-calls applies to the guess-number workload (arithmetic has no tools), got {args.max_tool_calls}"
        )
    if args.max_staleness < 0:
        raise ConfigError(f"--max-staleness must be 0 (synchronous) or more, got {args.max_staleness}")
    if not args.best and (args.best_steps is not None or args.candidates is not None):
        raise ConfigError("--best-steps and --candidates apply with --best only")
    best_steps = DEFAULT_BEST_STEPS if args.best_steps is None else args.best_steps
    if best_steps < 2:
        raise ConfigError(f"--best-steps must be at least 2 (one warm-up step, then timed steps), got {best_steps}")
    given = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "generations": args.generations,
        "max_completion_tokens": args.max_completion_tokens,
        "max_tool_calls": args.max_tool_calls,
        "lr": args.lr,
    }
    return Settings(
        **{**DEFAULTS[args.workload], **{k: v for k, v in given.items() if v is not None}},
        rounds=args.rounds,
        seed=args.seed,
        rollforge_mode=args.rollforge_mode,
        backend=args.backend,
        max_staleness=args.max_staleness,
        **(
            {"best_steps": best_steps, "candidates": parse_candidates(args.candidates or ",".join(CANDIDATES))}
            if args.best
            else {}
        ),
    )


def run(
    workload: Workload, settings: Settings, sides: tuple[str, ...] = ("trl", "rollforge"), out: str | None = None
) -> dict[str, Any]:
    import torch

    check_trl()
    if settings.steps < 2:
        raise ConfigError(f"--steps must be at least 2 (one warm-up step, then timed steps), got {settings.steps}")
    unknown = sorted(set(sides) - {"trl", "rollforge"})
    if unknown or not sides:
        raise ConfigError(f"--sides must name trl and/or rollforge, got {','.join(sides)!r}")
    if settings.candidates and set(sides) != {"trl", "rollforge"}:
        raise ConfigError(f"--best compares both sides, got --sides {','.join(sides)!r}")
    runners = {"trl": run_trl, "rollforge": run_rollforge}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    best_result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollforge-vs-trl-") as scratch:
        for round_ in range(settings.rounds):
            folder = Path(scratch) / f"round-{round_}"
            if set(sides) == {"trl", "rollforge"} and not settings.max_staleness:
                trl_run, rollforge_run = run_alternating(workload, settings, folder)
                runs["trl"].append(trl_run)
                runs["rollforge"].append(rollforge_run)
            else:
                for side in sides:
                    runs[side].append(runners[side](workload, settings, folder / side))
        if settings.candidates:
            best_result = run_best(workload, settings, Path(scratch) / "best", side_summary)
    result: dict[str, Any] = {
        "benchmark": "vs-trl",
        "ratio_step_time": None,
        "settings": {
            **settings.as_dict(),
            "workload": workload.name,
            "model": str(workload.model_dir),
            "completions_per_step": settings.completions,
            "torch_threads": torch.get_num_threads(),
        },
    }
    for side in sides:
        result[side] = side_summary(runs[side])
    if "trl" in result and "rollforge" in result:
        result["ratio_step_time"] = round(
            result["rollforge"]["seconds_per_step"] / result["trl"]["seconds_per_step"], 4
        )
    result.update(best_result)
    result["learning_curves"] = {side: [r["rewards"] for r in runs[side]] for side in sides}
    result["notes"] = _notes(workload, runs) + _configuration_notes(settings)
    if out is not None:
        _write(Path(out), result)
    return result


def check_trl() -> None:
    from ...errors import require

    require("trl", extra="bench-trl", feature="the TRL comparison benchmark")
    from trl.chat_template_utils import qwen2_5_chat_template

    if qwen2_5_chat_template != QWEN25_TEMPLATE:
        import trl

        raise ConfigError(
            f"trl {trl.__version__} ships a different Qwen2.5 chat template than the one this benchmark's model "
            "uses (trl 1.16.0's), so TRL would not parse its tool calls; pip install 'rollforge[bench-trl]'"
        )


def side_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    timed = [t for r in runs for t in r["step_seconds"][1:]]
    steps = [s for r in runs for s in r["steps"][1:]]
    summary = {
        "configuration": runs[0]["configuration"],
        "seconds_per_step": round(statistics.fmean(timed), 4),
        "seconds_per_step_median": round(statistics.median(timed), 4),
        "seconds_per_step_per_round": [round(statistics.fmean(r["step_seconds"][1:]), 4) for r in runs],
        "timed_steps": len(timed),
        "generated_tokens_per_step": round(statistics.fmean(s["generated_tokens"] for s in steps), 1),
        "assistant_turns_per_step": round(statistics.fmean(s["assistant_turns"] for s in steps), 2),
        "tool_calls_per_step": round(statistics.fmean(s["tool_calls"] for s in steps), 2),
        "phases_seconds_per_step": {p: round(statistics.fmean(s["phases"][p] for s in steps), 4) for p in PHASES},
        "mean_reward": round(statistics.fmean(s["reward"] for s in steps), 4),
        "prompt_tokens": runs[0]["prompt_tokens"],
        "run_seconds": [round(r["run_seconds"], 2) for r in runs],
        "step_seconds": [[round(t, 3) for t in r["step_seconds"]] for r in runs],
    }
    if steps[0].get("context_tokens") is not None:
        summary["context_tokens_per_step"] = round(statistics.fmean(s["context_tokens"] for s in steps), 1)
    if "tool_failures" in steps[0]:
        summary["tool_call_failures_per_step"] = round(statistics.fmean(s["tool_failures"] for s in steps), 2)
    return summary


def _notes(workload: Workload, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    notes = [
        "both trainers start from the same weights and take strictly alternating steps in one process (load "
        "from other processes on a shared machine falls on both alike); the first step of each is untimed",
        "phases: TRL generation = _generate, update = loss forward/backward + clip/optimizer step, other = rewards, "
        "advantages, padding; rollforge generation = time/rollout (generation, environment, rewards, advantages), "
        "update = time/update, other = time/sync",
        "TRL scales advantages by the sample std of the group (torch .std), rollforge by the population std "
        "(a constant factor per group size; the loss aggregation, clipping and token counts are the same)",
    ]
    if workload.multi_turn:
        notes += [
            "tool-call budget: TRL max_tool_calling_iterations = rollforge max_turns - 1; token budget after the "
            "prompt (tool results included): TRL max_completion_length = rollforge max_seq_len - prompt tokens",
            "TRL keeps going after a correct guess until the model answers without a tool call, and so does "
            "rollforge (the environment has no `done` attribute)",
            "a tool call that does not parse: TRL takes the reply as a final answer (the episode ends), "
            "rollforge answers with an 'Error: ...' tool message and the episode goes on (a counted failure); "
            "TRL's tool_call_failures_per_step counts only calls that raised",
            "both re-read each episode's whole history at every turn (no KV cache kept across turns); TRL in "
            "lockstep (one left-padded model.generate per turn over the episodes still calling tools, each call "
            "decoding until its longest row ends), rollforge's HF backend by continuous batching (an episode's "
            "next turn joins the running batch as soon as its tool result is in; finished rows leave)",
        ]
    else:
        notes.append(
            "single turn: TRL runs one left-padded model.generate over all completions, decoding until the longest "
            "ends; rollforge's HF backend batches them continuously (finished rows leave the batch)"
        )
    if "trl" in runs and "rollforge" in runs:
        ours, theirs = runs["rollforge"][0]["prompt_tokens"], runs["trl"][0]["prompt_tokens"]
        if ours != theirs:
            notes.append(f"prompt tokens differ: rollforge {ours}, TRL {theirs} (each library renders the template)")
    return notes


def _configuration_notes(settings: Settings) -> list[str]:
    notes = [
        f"rollforge side: backend {settings.backend}, max_staleness {settings.max_staleness}; TRL side: model.generate"
    ]
    if settings.max_staleness:
        notes.append(
            "with max_staleness >= 1 the two trainers ran one after the other, not alternating (the "
            "asynchronous loop generates between its steps, which would overlap TRL's)"
        )
    if settings.candidates:
        notes.append(
            f"--best: each candidate trained alone for {settings.best_steps} steps (the first untimed); "
            f"each side's fastest then trained {settings.steps} steps, TRL's first; ratio_step_time_best "
            "compares those two runs"
        )
    return notes


# -- output ----------------------------------------------------------------------------------------


def _write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib
    except ImportError:
        result["notes"].append("learning_curves.png needs matplotlib (the bench-trl extra)")
        matplotlib = None
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    if matplotlib is None:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for side, color in (("trl", "tab:orange"), ("rollforge", "tab:blue")):
        for i, curve in enumerate(result["learning_curves"].get(side, [])):
            ax.plot(
                range(1, len(curve) + 1),
                curve,
                color=color,
                alpha=1.0 if i == 0 else 0.5,
                marker="o",
                label=f"{side} ({result[side]['seconds_per_step']:.2f} s/step)" if i == 0 else None,
            )
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title(
        f"{result['settings']['workload']}, {result['settings']['batch_size']}x{result['settings']['generations']} "
        f"completions/step (one line per run)"
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)
