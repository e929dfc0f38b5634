"""``rollforge train CONFIG.yaml [--set key=value ...] [--resume | --overwrite]``: the GRPO run of
``recipes/launch.py``, into an ``out`` that holds no run yet, or continuing (``--resume``) or
replacing (``--overwrite``) the one it holds; interrupted (Ctrl-C), it exits 130 naming the step to
resume after. ``--nproc N`` runs the same command under torchrun on N ranks. Around the run
(``starts.py``): a changed config on ``--resume`` is refused and a finished one has nothing to do;
a failed start leaves no ``config.yaml``; the end prints a summary and writes ``report.md``.

The flags every training command takes (``--set``, ``--executor``, ``--ray-address``) and the
config they build are public here (``add_run_flags``, ``flag_overrides``, ``load_train_config``):
``rollforge quickstart`` takes them too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    train = commands.add_parser("train", help="train a model with GRPO from a YAML config")
    train.add_argument("config", nargs="?", type=Path, help="YAML config (omit with --help-config)")
    add_run_flags(train)
    start = train.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    start.add_argument("--overwrite", action="store_true", help="delete the run that out holds, then start over")
    train.add_argument("--help-config", action="store_true", help="print every config key with its default and meaning")
    train.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="train on N ranks of this node with FSDP2: runs `torchrun --nproc-per-node N -m rollforge train ...`",
    )
    train.add_argument("--nnodes", type=int, default=1, help="nodes taking part (with --nproc; torchrun's rendezvous)")
    train.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="rendezvous of a several-node run (with --nnodes > 1), as torchrun's --rdzv-endpoint",
    )
    train.set_defaults(run=_train)


def add_run_flags(p: Any) -> None:
    """``--set``, ``--executor`` and ``--ray-address`` (``rollforge train`` and ``quickstart``)."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        dest="overrides",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set algorithm.batch_size=4 (repeatable)",
    )
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default=None,
        help="where environments run (overrides the config's executor; ray: see the ray section)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join with --executor ray (auto, ray://host:10001); default: a private local instance",
    )


def flag_overrides(args: Any) -> list[str]:
    """``--set`` values, then ``--executor`` and ``--ray-address`` as the keys they set."""
    extra = [f"executor={args.executor}"] if args.executor else []
    if args.ray_address:
        extra.append(f"ray.address={args.ray_address}")
    return [*args.overrides, *extra]


def load_train_config(path: Path, overrides: list[str], args: Any):
    """The training config; ``--ray-address`` is refused when the executor it ends up with (the
    config's, or ``--executor``) is not ``ray``."""
    from ..cli.rollout import check_ray_flags
    from ..train.config import build_config, read_config_data

    data = read_config_data(path, overrides, {})
    check_ray_flags(args, data.get("executor", "local"), ("--ray-address",))
    return build_config(data)


def _train(args: Any) -> int:
    from ..errors import ConfigError
    from ..recipes.launch import train, where_to_continue
    from ..train.config import TrainConfig
    from ..train.config_files import describe_config
    from . import starts

    if args.help_config:
        print(describe_config(TrainConfig))
        return 0
    if args.config is None:
        raise ConfigError("rollforge train needs a config file (see examples/), or --help-config")
    config = load_train_config(args.config, flag_overrides(args), args)
    out = Path(config.out)
    if args.resume and (done := starts.resume_start(config, config.steps)) is not None:
        print(starts.nothing_to_do(out, done, config.steps))
        return 0
    if args.nproc is not None:
        _check_launcher_flags(args)
        starts.check_launch(config, args.nproc * args.nnodes)  # once here, not once per rank
        return _torchrun(args)
    since = starts.resumed_from(out) if args.resume else 0
    began = time.perf_counter()
    try:
        with starts.clean_failed_start(out):
            result = train(config, resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt:  # the step in flight finished its update and checkpoint, or was dropped
        print(f"rollforge: interrupted; {where_to_continue(out)}", file=sys.stderr)
        return 130
    if (lines := starts.finish_train(result, since, time.perf_counter() - began)) is not None:
        print(lines)  # rank 0's
    return 0


def _check_launcher_flags(args: Any) -> None:
    from ..errors import ConfigError

    if args.nproc < 1 or args.nnodes < 1:
        raise ConfigError(f"--nproc and --nnodes must be >= 1, got {args.nproc} and {args.nnodes}")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")


def _torchrun(args: Any) -> int:
    """Re-run this command under torchrun on ``--nproc`` ranks (per node), without the launcher flags."""
    import subprocess

    where = (
        ["--nnodes", str(args.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
        if args.nnodes > 1
        else ["--standalone"]
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        "--nproc-per-node",
        str(args.nproc),
        "-m",
        "rollforge",
        "train",
        str(args.config),
        *[a for o in args.overrides for a in ("--set", o)],
    ]
    if args.executor:
        command += ["--executor", args.executor]
    if args.ray_address:
        command += ["--ray-address", args.ray_address]
    command += [flag for flag, given in (("--resume", args.resume), ("--overwrite", args.overwrite)) if given]
    return subprocess.call(command)
