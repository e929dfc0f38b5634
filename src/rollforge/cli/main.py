"""The ``rollforge`` command: one sub-command per module, each with its own small parser."""

from __future__ import annotations

import argparse
import sys

from ..errors import RollforgeError
from . import bench, env, rollout, train
from . import sft as sft_command
from . import view as view_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollforge", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rollout.add_parser(commands)
    bench.add_parser(commands)
    env.add_parser(commands)
    train.add_parser(commands)
    sft_command.add_parser(commands)
    view_command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except RollforgeError as exc:
        print(f"rollforge: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
