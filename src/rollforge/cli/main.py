"""The ``rollforge`` command: one sub-command per module, each with its own small parser.

A user's mistake (a bad flag or value, a config or data file that does not parse, a server that
is down) is a ``RollforgeError`` raised before the work starts; it is answered with one line on
stderr, ``rollforge: error: ...``, and exit status 2, never a traceback. A fault of the machine
while writing results (a full disk or quota, a read-only file system, no permission: an
``OSError`` with one of ``ENVIRONMENT_FAULTS``) is one line naming the file, exit status 1; what
was already written stays valid (each writer's own rule). Ctrl-C is one line, exit status 130.
Output into a pipe whose reader has gone (``rollforge train --help-config | head``) ends the command
quietly with status 141, as a tool killed by SIGPIPE (Python ignores that signal, so it would be a
traceback): the rest of the output goes to the null device.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys

from ..errors import RollforgeError
from . import bench, check_template, env, gateway, quickstart, rollout, train
from . import eval as eval_command
from . import sft as sft_command
from . import view as view_command


class _Parser(argparse.ArgumentParser):
    """Answers a bad command line in one line (not the usage block), like every other mistake; a
    misspelled flag gets the nearest one of its command, as a misspelled config key does."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # each (sub)command's parser checks its own flags
        namespace, extras = super().parse_known_args(args, namespace)
        flags = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
        for extra in extras:
            if extra.startswith("--"):
                from ..train.config_files import did_you_mean

                if hint := did_you_mean(extra.partition("=")[0], flags):
                    self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rollforge",
        description="Multi-turn rollouts between language-model policies and environments, and training on them.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rollout.add_parser(commands)
    bench.add_parser(commands)
    env.add_parser(commands)
    train.add_parser(commands)
    quickstart.add_parser(commands)
    eval_command.add_parser(commands)
    check_template.add_parser(commands)
    gateway.add_parser(commands)
    sft_command.add_parser(commands)
    view_command.add_parser(commands)
    return parser


class _Warnings(logging.Handler):
    """rollforge's warnings as ``rollforge: warning: ...`` lines on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"rollforge: {record.levelname.lower()}: {_one_line(record.getMessage())}", file=sys.stderr)


def _library_logs_to_stderr() -> None:
    """stdout carries the command's output (a benchmark's JSON); vLLM logs to stdout by default:
    in its engine processes and in this one, whether imported later or already."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    for handler in logging.getLogger("vllm").handlers:
        if type(handler) is logging.StreamHandler and handler.stream is not sys.stderr:
            with handler.lock:  # not setStream: it flushes the old stream, which may be closed
                handler.stream = sys.stderr


def main(argv: list[str] | None = None) -> int:
    _library_logs_to_stderr()
    package_logger = logging.getLogger("rollforge")
    if not any(isinstance(h, _Warnings) for h in package_logger.handlers):
        package_logger.addHandler(_Warnings(logging.WARNING))
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a bad command line already answered in one line
        return exc.code if isinstance(exc.code, int) else 2
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return code
    except BrokenPipeError:
        _silence_output()
        return 141
    except RollforgeError as exc:
        print(f"rollforge: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_FAULTS:
            raise
        print(f"rollforge: error: {describe_fault(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rollforge: interrupted", file=sys.stderr)
        return 130


#: Faults of the machine, not of rollforge or the command line, answered in one line.
ENVIRONMENT_FAULTS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})


def describe_fault(exc: OSError) -> str:
    """``PATH: no space left on device``."""
    reason = (exc.strerror or os.strerror(exc.errno)).lower()
    return f"{exc.filename}: {reason}" if exc.filename else reason


def _silence_output() -> None:
    """Point stdout and stderr at the null device, so that flushing what is still buffered for the
    closed pipe at exit raises nothing (Python's documented answer to ``BrokenPipeError``)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # not a real file (a test's captured stream)
            os.dup2(devnull, stream.fileno())
    os.close(devnull)


def _one_line(what: object) -> str:
    """An exception or message on one line (a multi-line message is joined)."""
    return " ".join(str(what).split()) or type(what).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
