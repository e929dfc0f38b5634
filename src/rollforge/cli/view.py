"""``rollforge view RUN_DIR [--out FILE] [--model NAME]``: write one self-contained HTML file for a
rollout or training run, a trajectories ``.jsonl`` file or a directory of them (``rollforge/view``). ``--model`` names the tokenizer that turns token ids
into text (a training run's own ``config.yaml`` names one; without either, ids are shown)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    p = commands.add_parser("view", help="write a self-contained HTML view of a rollout or training run")
    p.add_argument(
        "run_dir",
        type=Path,
        metavar="RUN_DIR",
        help="a rollout (trajectories.jsonl) or training run (metrics.jsonl) directory, "
        "a trajectories .jsonl file or a directory of them",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="HTML file to write (default RUN_DIR/view.html; for a file, its name with .html)",
    )
    p.add_argument("--model", default=None, help="model directory or alias whose tokenizer decodes the tokens")
    p.set_defaults(run=_run)


def _run(args: Any) -> int:
    from ..view import write_view

    path = write_view(args.run_dir, args.out, model=args.model)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); open it in a browser")
    return 0
