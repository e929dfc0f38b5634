"""``rollforge quickstart``: ``recipes/quickstart.py``, a supervised warm-up on expert
demonstrations (``recipes/presets/quickstart_warmup.yaml``; ``--set warmup.KEY=VALUE`` overrides it),
then ``train`` on ``recipes/presets/quickstart.yaml`` from the warmed-up weights, then the report of
both phases (printed). It takes ``rollforge train``'s ``--set``, ``--executor`` and ``--ray-address``.
``--preset chain`` runs the harder demonstration instead (``presets/chain.yaml`` and
``presets/chain_warmup.yaml``: chains of two calculator operations, three tool turns).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .train import add_run_flags, flag_overrides, load_train_config

#: ``--preset NAME``: its GRPO preset and its warm-up preset, in ``recipes/presets``.
PRESET_FILES = {
    "calculator": ("quickstart.yaml", "quickstart_warmup.yaml"),
    "chain": ("chain.yaml", "chain_warmup.yaml"),
}


def add_parser(commands: Any) -> None:
    quick = commands.add_parser(
        "quickstart",
        help="SmolLM2-135M on CPU: SFT warm-up on calculator tool-call demonstrations, then GRPO that learns which tool each question needs",
    )
    quick.add_argument(
        "--preset",
        choices=sorted(PRESET_FILES),
        default="calculator",
        help="calculator (default): one operation, two tool turns; chain: two operations, three tool turns",
    )
    quick.add_argument("--out", type=Path, default=None, help="default: runs/quickstart (chain: runs/chain)")
    quick.add_argument("--steps", type=int, default=None)
    quick.add_argument("--model", default=None, help="model directory or alias (default smollm2-135m)")
    quick.add_argument("--backend", choices=["hf", "vllm", "openai"], default=None)
    quick.add_argument("--base-url", default=None, help="server URL for --backend openai")
    add_run_flags(quick)
    start = quick.add_mutually_exclusive_group()
    start.add_argument(
        "--resume", action="store_true", help="reuse the base evaluation and a finished warm-up, continue GRPO"
    )
    start.add_argument(
        "--overwrite", action="store_true", help="delete the quickstart that --out holds, then start over"
    )
    quick.set_defaults(run=_quickstart)


def _quickstart(args: Any) -> int:
    from ..cli.rollout_results import check_out_dir
    from ..recipes.quickstart import PRESETS, quickstart
    from ..recipes.sft_config import load_sft_config

    if args.out is not None:
        check_out_dir(args.out, "--out")
    overrides = []
    for key, value in (
        ("out", args.out),
        ("steps", args.steps),
        ("model.name", args.model),
        ("model.backend", args.backend),
        ("model.base_url", args.base_url),
    ):
        if value is not None:
            overrides.append(f"{key}={value}")
    grpo = [o for o in flag_overrides(args) if not o.startswith("warmup.")]
    warmup = [o.removeprefix("warmup.") for o in args.overrides if o.startswith("warmup.")]
    grpo_preset, warmup_preset = PRESET_FILES[args.preset]
    config = load_train_config(PRESETS / grpo_preset, [*overrides, *grpo], args)
    result = quickstart(
        config,
        load_sft_config(PRESETS / warmup_preset, warmup),
        resume=args.resume,
        overwrite=args.overwrite,
    )
    print(result.report.read_text())
    return 0
