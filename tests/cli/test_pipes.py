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
        done = subprocess.run([sys.executable, "-m", "rollforge", "train", "--help-config"], stdout=write,
                              stderr=subprocess.PIPE, env=env, timeout=300, check=False)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr.decode()) == (141, "")
