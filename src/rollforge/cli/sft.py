"""``rollforge sft CONFIG [--from-rollouts] [--set key=value ...] [--overwrite]``: supervised
fine-tuning on trajectories, conversations or expert demonstrations (``recipes/sft.py``);
``--from-rollouts`` adds rejection-sampling rounds on the current model's own rollouts
(``from_rollouts`` section). An ``out`` that holds a run already is refused unless ``--overwrite``.
A start that fails leaves no ``config.yaml``; the end prints a summary and plots ``loss_curve.png``
(``starts.py``)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "sft", help="supervised fine-tuning on trajectories, conversations or expert demonstrations"
    )
    p.add_argument("config", nargs="?", type=Path, help="YAML config (omit with --help-config)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set batch_size=4 (repeatable)",
    )
    p.add_argument(
        "--from-rollouts",
        action="store_true",
        help="after the sources, roll out the model and train on episodes with reward >= from_rollouts.min_reward",
    )
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    start.add_argument(
        "--overwrite", action="store_true", help="delete the run that config's out holds, then start over"
    )
    p.add_argument("--help-config", action="store_true", help="print every config key with its default and meaning")
    p.set_defaults(run=_run)


def _run(args: Any) -> int:
    from ..errors import ConfigError
    from ..recipes.sft import sft
    from ..recipes.sft_config import SFTConfig, load_sft_config
    from ..train.config_files import describe_config
    from . import starts

    if args.help_config:
        print(describe_config(SFTConfig))
        return 0
    if args.config is None:
        raise ConfigError("rollforge sft needs a config file (see examples/sft_expert.yaml), or --help-config")
    extra = ["from_rollouts.enabled=true"] if args.from_rollouts else []
    config = load_sft_config(args.config, [*args.overrides, *extra])
    began = time.perf_counter()
    out, since = Path(config.out), 0
    if args.resume:
        if (done := starts.resume_start(config, config.max_steps or math.inf)) is not None:
            print(starts.nothing_to_do(out, done, config.max_steps, "max_steps"))
            return 0
        since = starts.resumed_from(out)
    with starts.clean_failed_start(out):
        result = sft(config, overwrite=args.overwrite, resume=args.resume)
    print(starts.finish_sft(result, time.perf_counter() - began, since))
    return 0
