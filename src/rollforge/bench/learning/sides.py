"""The processes of ``rollforge bench learning``: each side runs in a process of its own, one after
the other, so that only one model and one optimizer state are alive at a time.

``spawn(side, spec, scratch)`` (the parent's half) runs ``python -m rollforge.bench.learning.sides
SIDE SPEC OUT`` with this rollforge first on the path and returns the JSON the child wrote to OUT:

- ``warmup``: builds the warm-up checkpoint (or takes ``--warmup DIR``), renders it with TRL's
  template (``templated``) and scores it on the held-out questions: step 0 of both curves.
- ``rollforge`` then ``trl``: trains from that checkpoint (``vs_trl.runners``), scoring the held-out
  questions every ``eval_every`` steps and after the last, outside the step clock.

Each child adds its peak resident memory (``max_rss_mb``, from ``getrusage``). A child that fails
writes its error as one line; the parent raises ``SideFailed`` naming the side and that line, or
the signal that killed the child (SIGKILL is how the kernel ends a process out of memory).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

from ...errors import ConfigError, RollforgeError, SideFailed
from ..vs_trl.workloads import calculator
from .settings import LearningSettings

PR_SET_PDEATHSIG = 1
HELD_OUT_SEED = 1_000_003  # the held-out questions' seed, offset from the training rows' seed
PARENT = "ROLLFORGE_BENCH_PARENT"  # the parent's pid, in the child's environment
#: The child's command line, before ``SIDE SPEC OUT``.
CHILD = (sys.executable, "-m", __name__)


# -- the parent's half -----------------------------------------------------------------------------


def spawn(side: str, spec: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """Run ``side`` in a child process; its JSON result (or ``SideFailed``)."""
    spec_file, out_file = scratch / f"{side}.spec.json", scratch / f"{side}.result.json"
    spec_file.write_text(json.dumps(spec))
    source = str(Path(__file__).resolve().parents[3])  # the rollforge this parent runs
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])),
        PARENT: str(os.getpid()),
    }
    code = subprocess.run(
        [*CHILD, side, str(spec_file), str(out_file)], env=env, stdin=subprocess.DEVNULL, check=False
    ).returncode
    written = json.loads(out_file.read_text()) if out_file.is_file() else {}
    if code == 0 and "error" not in written:
        return written
    if "error" in written:
        raise SideFailed(f"bench learning: the {side} side failed: {written['error']}")
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    hint = " (perhaps out of memory)" if code == -signal.SIGKILL else ""
    raise SideFailed(f"bench learning: the {side} side {how}{hint} before writing its result")


# -- the child's half ------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    side, spec_file, out_file = argv
    die_with_parent(int(os.environ.get(PARENT, "0")))
    os.dup2(2, 1)  # the Trainer and the SFT print logs; the parent's stdout is for its JSON
    spec = json.loads(Path(spec_file).read_text())
    try:
        result = SIDES[side](spec)
    except Exception as exc:  # reported to the parent as one line; a bug's traceback on stderr
        if not isinstance(exc, RollforgeError):
            traceback.print_exc()
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        Path(out_file).write_text(json.dumps({"error": f"{type(exc).__name__}: {line}".rstrip(": ")}))
        return 1
    result["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
    Path(out_file).write_text(json.dumps(result))
    return 0


def die_with_parent(parent: int) -> None:
    """End this side when the parent ends, however it ends (``kill PID`` reaches only the parent;
    Ctrl-C reaches the whole process group): Linux's parent-death signal; elsewhere nothing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        return
    if parent and os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)


def warmup_side(spec: dict[str, Any]) -> dict[str, Any]:
    import time

    scratch, settings = Path(spec["scratch"]), LearningSettings.from_json(spec["settings"])
    started = time.perf_counter()
    source = Path(spec["warmup"]) if spec["warmup"] else warm_up(spec["model"], scratch, settings)
    model_dir = templated(source, scratch / "model")
    seconds = time.perf_counter() - started
    reward = progress("warm-up", 0, HeldOut(model_dir, settings).score_model(load(model_dir)))
    return {"model_dir": str(model_dir), "reward": reward, "seconds": round(seconds, 1)}


def trainer_side(side: str):
    """The ``rollforge`` or ``trl`` side: its run (``vs_trl.runners``) and held-out rewards by step."""

    def run(spec: dict[str, Any]) -> dict[str, Any]:
        from ..vs_trl.runners import run_rollforge
        from ..vs_trl.trl_side import run_trl

        settings, model_dir = LearningSettings.from_json(spec["settings"]), Path(spec["model_dir"])
        workload = calculator(
            model_dir, list(settings.operations), seed=settings.run.seed, balanced=settings.balanced, closing=True
        )
        held_out, points = HeldOut(model_dir, settings), {}
        runner = run_rollforge if side == "rollforge" else run_trl
        result = runner(workload, settings.run, Path(spec["scratch"]) / side, None, held_out.hook(side, points))
        return {"run": result, "points": points}

    return run


SIDES = {"warmup": warmup_side, "rollforge": trainer_side("rollforge"), "trl": trainer_side("trl")}


# -- the warm-up checkpoint ------------------------------------------------------------------------


def warm_up(model: str, scratch: Path, settings: LearningSettings) -> Path:
    """The quickstart's warm-up (SFT on expert demonstrations) of ``model``, rendered with the
    template both trainers will use; the final checkpoint's model directory."""
    from ...models import resolve_model
    from ...recipes.quickstart import PRESETS
    from ...recipes.sft import sft
    from ...recipes.sft_config import load_sft_config
    from ...train import checkpoint as ckpt

    base = templated(resolve_model(model), scratch / "base")
    config = load_sft_config(PRESETS / "quickstart_warmup.yaml", [f"seed={settings.run.seed}"])
    sources = [  # the whole episode both sides play: compute, answer, then the closing reply
        s.model_copy(update={"options": {**s.options, "closing": True}}) if s.kind == "expert" else s
        for s in config.sources
    ]
    config = config.model_copy(
        update={
            "out": str(scratch / "warmup"),
            "model": config.model.model_copy(update={"name": str(base), "backend": "hf", "dtype": settings.run.dtype}),
            "sources": sources,
            "rollout": config.rollout.model_copy(update={"max_turns": settings.run.max_turns}),
        }
    )
    with contextlib.redirect_stdout(sys.stderr):
        sft(config, console=False)
    return ckpt.latest_checkpoint(scratch / "warmup" / "checkpoints") / "model"


def check_warmup(model_dir: Path) -> None:
    """Refuse a ``--warmup`` checkpoint trained under another chat template than the one both sides
    render (TRL's Qwen2.5): its tool calls would not parse there (a quickstart warm-up, trained on
    SmolLM2's template with rollforge's tool prompt, scored 0.0 and wrote invalid JSON in 42 of 64 turns)."""
    from ..vs_trl.env import QWEN25_TEMPLATE

    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"--warmup must be a model directory (with config.json), got {model_dir}")
    jinja, config = model_dir / "chat_template.jinja", model_dir / "tokenizer_config.json"
    template = (
        jinja.read_text()
        if jinja.is_file()
        else (json.loads(config.read_text()).get("chat_template") if config.is_file() else None)
    )
    if template != QWEN25_TEMPLATE:
        raise ConfigError(
            f"--warmup {model_dir} was trained under another chat template than bench learning renders "
            "(TRL's Qwen2.5, which TRL parses tool calls from): use a warm-up that bench learning built "
            "(omit --warmup), not the quickstart's"
        )


def templated(source: Path, target: Path) -> Path:
    """``source``'s model with TRL's Qwen2.5 chat template (ChatML, like SmolLM2's, plus tools):
    the tokenizer saved again, every other file linked."""
    from transformers import AutoTokenizer

    from ..vs_trl.env import QWEN25_TEMPLATE

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


def load(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


# -- held-out evaluation ---------------------------------------------------------------------------


class HeldOut:
    """Greedy episodes on the held-out questions, scored by rollforge's evaluator for both sides."""

    def __init__(self, model_dir: Path, settings: LearningSettings):
        from ...chat.render import ChatRenderer
        from ...inputs.config import EnvConfig
        from ...inputs.read import Prompts, read_inputs
        from ...models import load_tokenizer
        from ...rollout.config import RolloutConfig

        self.model_dir, self.settings = model_dir, settings
        calculator = EnvConfig(name="calculator", options={"operations": list(settings.operations), "closing": True})
        self.task_to_env, self.samples = read_inputs(
            [calculator], Prompts(generated=settings.eval_episodes, seed=HELD_OUT_SEED + settings.run.seed)
        )
        self.tokenizer = load_tokenizer(model_dir)
        self.renderer = ChatRenderer(self.tokenizer)
        self.greedy = RolloutConfig(
            max_turns=settings.run.max_turns,
            max_new_tokens=settings.run.max_new_tokens,
            max_seq_len=1024,
            greedy=True,
            seed=settings.run.seed,
            concurrency=settings.eval_episodes,
        )

    async def score(self, backend: Any) -> float:
        from ...inputs.evaluate import aevaluate

        result = await aevaluate(self.samples, self.task_to_env, backend, self.renderer, self.greedy)
        return round(result.mean_reward, 4)

    def score_model(self, model: Any) -> float:
        """On an HF backend over ``model`` (TRL's, or the warm-up's), in this thread."""
        from ...backends.config import BackendConfig
        from ...inputs.evaluate import evaluate
        from ...workers import run_sync

        config = BackendConfig(
            kind="hf", model=str(self.model_dir), concurrency=len(self.samples), seed=self.settings.run.seed
        )
        was_training = model.training
        model.eval()
        try:
            result = run_sync(
                evaluate(config, self.samples, self.task_to_env, self.renderer, self.greedy, hf_model=model)
            )
            return round(result.mean_reward, 4)
        finally:
            model.train(was_training)

    def due(self, step: int) -> bool:
        return step % self.settings.eval_every == 0 or step == self.settings.run.steps

    def hook(self, side: str, points: dict[int, float]) -> Any:
        """``side``'s ``after_step`` (see ``vs_trl.runners``): the held-out reward into ``points``."""

        def trl(step: int, model: Any) -> None:
            if self.due(step):
                points[step] = progress("trl", step, self.score_model(model))

        async def rollforge(step: int, model: Any, backend: Any) -> None:
            if self.due(step):
                points[step] = progress("rollforge", step, await self.score(backend))

        return rollforge if side == "rollforge" else trl


def progress(side: str, step: int, reward: float) -> float:
    """A line on stderr per held-out evaluation (a long run shows its curves as they grow)."""
    print(f"bench learning: {side} step {step}: held-out reward {reward}", file=sys.stderr, flush=True)
    return reward


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
