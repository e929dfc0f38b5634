"""Output into a pipe whose reader has gone (``rollforge train --help-config | head``) ends the
command quietly, status 141, through the real command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import rollforge


def test_a_closed_pipe_ends_the_command_quietly():
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte, as after `| head -1`
    env = {**os.environ, "PYTHONPATH": str(Path(rollforge.__file__).parents[1])}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "rollforge", "train", "--help-config"],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (141, "")


def test_vllm_logs_go_to_stderr_so_stdout_stays_the_commands_output(monkeypatch, capsys):
    """`vs-trl --best` printed vLLM's `ERROR ... AsyncLLM output_handler failed` on stdout before its
    JSON (vLLM logs to stdout by default): the JSON did not parse. The CLI sends vLLM's logs, in this
    process and in its engine processes, to stderr."""
    import logging
    import os

    from rollforge.cli.main import main

    monkeypatch.delenv("VLLM_LOGGING_STREAM", raising=False)
    vllm_logger = logging.getLogger("vllm")
    handler = logging.StreamHandler(sys.stdout)  # as vLLM configures itself on import
    vllm_logger.addHandler(handler)
    try:
        assert main(["bench", "no-such-benchmark"]) == 2
        vllm_logger.error("AsyncLLM output_handler failed")
        out, err = capsys.readouterr()
        assert "output_handler" not in out and "output_handler" in err
        assert (
            os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"
        )  # for vLLM imported later, and its engine processes
    finally:
        vllm_logger.removeHandler(handler)
