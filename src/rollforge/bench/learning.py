"""``rollforge bench learning``: held-out reward per step and per wall second, rollforge vs TRL.

Both trainers start from the same warm-up checkpoint and train on the ``calculator`` workload of
``vs_trl_workloads`` (its environment class is TRL's ``environment_factory`` and rollforge's
environment, unchanged) with the settings of ``vs_trl`` (same completions per step, token limits,
DAPO/token loss, lr, optimizer; strictly alternating steps in one process, see ``vs_trl_runners``).

- The warm-up: rollforge's SFT on the calculator expert's demonstrations with the quickstart's
  warm-up preset (``presets/quickstart_warmup.yaml``), built once per run; or ``--warmup DIR``.
  The model directory both trainers load carries TRL's Qwen2.5 chat template (``templated``): TRL
  parses tool calls only for templates it knows, and SmolLM2's ChatML template renders no tools.
- Held-out reward: the same ``eval_episodes`` calculator questions (a seed no training row uses),
  answered greedily, scored by rollforge's evaluator (``aevaluate``) on both sides: on rollforge's
  own backend, and on an HF backend over TRL's model. Every ``eval_every`` steps and after the last,
  on that side's turn and outside its step clock; step 0 (the warm-up) is evaluated once for both.
- Wall time of a curve point: the sum of that side's step times up to it (model loading and
  evaluation excluded). ``ratio_time_to_target``: rollforge's wall time to first reach the held-out
  reward TRL ends with, over TRL's; None when rollforge never reaches it or TRL ends no higher than
  where it started (``ratio_note`` says which).

Defaults, sized for about 15 minutes on 2 idle CPU cores (the warm-up a few of them): SmolLM2-135M,
6 GRPO steps of 2 prompts x 4 completions per side, 64 completion tokens, one tool call, lr 3e-5,
16 held-out questions every 2 steps.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .vs_trl_workloads import CALCULATOR_ENV, DEFAULTS, calculator

HELD_OUT_SEED = 1_000_003  # the held-out questions' seed, offset from the training rows' seed


def add_arguments(parser: Any) -> None:
    d = DEFAULTS["calculator"]
    parser.add_argument("--model", default="smollm2-135m", help="base model the warm-up starts from (default smollm2-135m)")
    parser.add_argument("--warmup", default=None, metavar="DIR",
                        help="an existing warm-up checkpoint's model dir (e.g. runs/quickstart/warmup/checkpoints/"
                             "step-N/model) instead of building one")
    parser.add_argument("--steps", type=int, default=d["steps"], help=f"GRPO steps per side (default {d['steps']})")
    parser.add_argument("--batch-size", type=int, default=d["batch_size"], help=f"prompts per step (default {d['batch_size']})")
    parser.add_argument("--generations", type=int, default=d["generations"], help=f"completions per prompt (default {d['generations']})")
    parser.add_argument("--max-completion-tokens", type=int, default=d["max_completion_tokens"],
                        help=f"default {d['max_completion_tokens']}")
    parser.add_argument("--lr", type=float, default=d["lr"], help=f"default {d['lr']}")
    parser.add_argument("--eval-every", type=int, default=2, help="steps between held-out evaluations (default 2)")
    parser.add_argument("--eval-episodes", type=int, default=16, help="held-out questions (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for result.json and learning_curves.png")


def main(args: Any) -> dict[str, Any]:
    settings = {
        "steps": args.steps, "batch_size": args.batch_size, "generations": args.generations,
        "max_completion_tokens": args.max_completion_tokens, "max_tool_calls": DEFAULTS["calculator"]["max_tool_calls"],
        "lr": args.lr, "seed": args.seed, "rollforge_mode": "async",
        "eval_every": args.eval_every, "eval_episodes": args.eval_episodes,
    }
    return run(args.model, settings, warmup=args.warmup, out=args.out)


def run(model: str, settings: dict[str, Any], warmup: str | None = None, out: str | None = None) -> dict[str, Any]:
    from .vs_trl import _check_trl
    from .vs_trl_runners import run_alternating

    _check_trl()
    for key in ("steps", "eval_every", "eval_episodes"):
        if settings[key] < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be at least 1, got {settings[key]}")
    with tempfile.TemporaryDirectory(prefix="rollforge-bench-learning-") as scratch:
        started = time.perf_counter()
        model_dir = templated(Path(warmup) if warmup else warm_up(model, Path(scratch), settings["seed"]),
                              Path(scratch) / "model")
        warmup_seconds = time.perf_counter() - started
        workload = calculator(model_dir, seed=settings["seed"])
        held_out = HeldOut(model_dir, settings)
        start_reward = _progress("warm-up", 0, held_out.score_model(_load(model_dir)))
        points: dict[str, dict[int, float]] = {"trl": {0: start_reward}, "rollforge": {0: start_reward}}
        trl_run, rollforge_run = run_alternating(workload, settings, Path(scratch) / "runs", held_out.hooks(points))
    result = report(settings, {"trl": trl_run, "rollforge": rollforge_run}, points)
    result["settings"].update(model=model, warmup=warmup or "built: SFT on calculator expert demonstrations "
                              "(presets/quickstart_warmup.yaml)", warmup_seconds=round(warmup_seconds, 1))
    if out is not None:
        write(Path(out), result)
    return result


# -- the warm-up checkpoint ------------------------------------------------------------------------


def warm_up(model: str, scratch: Path, seed: int) -> Path:
    """The quickstart's warm-up (SFT on expert demonstrations) of ``model``, rendered with the
    template both trainers will use; the final checkpoint's model directory."""
    from ..models import resolve_model
    from ..train import checkpoint as ckpt
    from ..train.quickstart import PRESETS
    from ..train.sft import sft
    from ..train.sft_config import load_sft_config

    base = templated(resolve_model(model), scratch / "base")
    config = load_sft_config(PRESETS / "quickstart_warmup.yaml", [f"seed={seed}"])
    config = config.model_copy(update={"out": str(scratch / "warmup"),
                                       "model": config.model.model_copy(update={"name": str(base), "backend": "hf"})})
    with contextlib.redirect_stdout(sys.stderr):  # stdout is for the JSON
        sft(config, console=False)
    return ckpt.latest_checkpoint(scratch / "warmup" / "checkpoints") / "model"


def templated(source: Path, target: Path) -> Path:
    """``source``'s model with TRL's Qwen2.5 chat template (ChatML, like SmolLM2's, plus tools):
    the tokenizer saved again, every other file linked."""
    from transformers import AutoTokenizer

    from .vs_trl_env import QWEN25_TEMPLATE

    if not (source / "config.json").is_file():
        raise ConfigError(f"--warmup must be a model directory (with config.json), got {source}")
    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.chat_template = QWEN25_TEMPLATE
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(target)
    for path in source.iterdir():
        if path.is_file() and not (target / path.name).exists() and not path.name.startswith("chat_template"):
            (target / path.name).symlink_to(path.resolve())
    return target


def _load(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


# -- held-out evaluation ---------------------------------------------------------------------------


class HeldOut:
    """Greedy episodes on the held-out questions, scored by rollforge's evaluator for both sides."""

    def __init__(self, model_dir: Path, settings: dict[str, Any]):
        from dataclasses import replace

        from ..chat.render import ChatRenderer
        from ..envs.library.calculator import samples
        from ..models import load_tokenizer
        from ..rollout.config import RolloutConfig
        from ..train.environments import build_environments
        from ..train.config import EnvConfig

        self.model_dir, self.settings = model_dir, settings
        self.samples = [replace(s, row={k: v for k, v in s.row.items() if k != "environment"})  # one class, all tools
                        for s in samples(settings["eval_episodes"], HELD_OUT_SEED + settings["seed"])]
        self.tokenizer = load_tokenizer(model_dir)
        self.renderer = ChatRenderer(self.tokenizer)
        self.task_to_env = build_environments([EnvConfig(name=CALCULATOR_ENV, task_name="calculator")])
        self.greedy = RolloutConfig(max_turns=settings["max_tool_calls"] + 1, max_new_tokens=settings["max_completion_tokens"],
                                    max_seq_len=1024, greedy=True, seed=settings["seed"],
                                    concurrency=settings["eval_episodes"])

    async def score(self, backend: Any) -> float:
        from ..train.evaluate import aevaluate

        result = await aevaluate(self.samples, self.task_to_env, backend, self.renderer, self.greedy)
        return round(result.mean_reward, 4)

    def score_model(self, model: Any) -> float:
        """On an HF backend over ``model`` (TRL's, or the warm-up's), in this thread."""
        from ..backends.config import BackendConfig
        from ..backends.opening import open_backend
        from ..workers import run_sync

        config = BackendConfig(kind="hf", model=str(self.model_dir), concurrency=len(self.samples), seed=self.settings["seed"])

        async def score() -> float:
            async with open_backend(config, hf_model=model, tokenizer=self.tokenizer) as backend:
                return await self.score(backend)

        was_training = model.training
        model.eval()
        try:
            return run_sync(score())
        finally:
            model.train(was_training)

    def due(self, step: int) -> bool:
        return step % self.settings["eval_every"] == 0 or step == self.settings["steps"]

    def hooks(self, points: dict[str, dict[int, float]]) -> dict[str, Any]:
        """Each side's ``after_step`` for ``run_alternating``: the held-out reward into ``points``."""

        def trl(step: int, model: Any) -> None:
            if self.due(step):
                points["trl"][step] = _progress("trl", step, self.score_model(model))

        async def rollforge(step: int, model: Any, backend: Any) -> None:
            if self.due(step):
                points["rollforge"][step] = _progress("rollforge", step, await self.score(backend))

        return {"trl": trl, "rollforge": rollforge}


def _progress(side: str, step: int, reward: float) -> float:
    """A line on stderr per held-out evaluation (a long run shows its curves as they grow)."""
    print(f"bench learning: {side} step {step}: held-out reward {reward}", file=sys.stderr, flush=True)
    return reward


# -- the report ------------------------------------------------------------------------------------


def report(settings: dict[str, Any], runs: dict[str, dict[str, Any]], points: dict[str, dict[int, float]]) -> dict[str, Any]:
    curves = {side: curve(runs[side]["step_seconds"], points[side]) for side in runs}
    ratio, note = time_to_target_ratio(curves["rollforge"], curves["trl"])
    result: dict[str, Any] = {
        "benchmark": "learning",
        "ratio_time_to_target": ratio,
        "ratio_note": note,
        "held_out_curves": curves,
        "settings": {**settings, "workload": "calculator",
                     "completions_per_step": settings["batch_size"] * settings["generations"]},
    }
    for side, run in runs.items():
        first, last = curves[side][0]["reward"], curves[side][-1]["reward"]
        result[side] = {
            "held_out_start": first, "held_out_end": last, "held_out_gain_per_step": round((last - first) / settings["steps"], 4),
            "train_seconds": round(sum(run["step_seconds"]), 2), "seconds_per_step": round(sum(run["step_seconds"]) / settings["steps"], 3),
            "train_reward_per_step": run["rewards"],
        }
    result["notes"] = [
        "wall seconds = the sum of that side's step times (generation, rewards, loss, optimizer; rollforge also "
        "its weight sync); model loading and held-out evaluation are outside them",
        "TRL ignores the environment's `done`: after the tool result it generates one more assistant turn (trained "
        "on, within max_completion_tokens); rollforge ends the episode at the call. The reward is the same "
        "(the value the one executed call returned)",
    ]
    return result


def curve(step_seconds: list[float], points: dict[int, float]) -> list[dict[str, float]]:
    """``[{step, seconds, reward}]`` at the evaluated steps; ``seconds`` summed up to that step."""
    return [{"step": step, "seconds": round(sum(step_seconds[:step]), 2), "reward": points[step]} for step in sorted(points)]


def time_to_target(points: list[dict[str, float]], target: float) -> float | None:
    return next((p["seconds"] for p in points if p["reward"] >= target), None)


def time_to_target_ratio(rollforge: list[dict[str, float]], trl: list[dict[str, float]]) -> tuple[float | None, str]:
    target = trl[-1]["reward"]
    if target <= trl[0]["reward"]:
        return None, f"TRL ends at held-out reward {target}, no higher than the warm-up's {trl[0]['reward']}: no target"
    ours, theirs = time_to_target(rollforge, target), time_to_target(trl, target)
    if ours is None:
        return None, f"rollforge did not reach TRL's final held-out reward {target} (it ended at {rollforge[-1]['reward']})"
    return round(ours / theirs, 4), f"target: TRL's final held-out reward {target}; rollforge {ours}s, TRL {theirs}s"


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
    fig.suptitle(f"calculator, {result['settings']['completions_per_step']} completions/step; "
                 f"ratio_time_to_target {ratio if ratio is not None else 'None (' + result['ratio_note'] + ')'}",
                 fontsize=9)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)
