"""verifiers environments (v0.4 tasksets), run unchanged in their own virtual environment.

verifiers 0.4 pins ``openai<3`` and ``mcp==2.0.0``, which rollforge's other extras cannot share,
so it lives in a virtual environment of its own, beside the one rollforge runs in: ``venvs/verifiers``
inside the active virtual environment, or ``~/.local/share/rollforge/venvs/verifiers`` for a Python
outside one (``ROLLFORGE_VERIFIERS_VENV`` points elsewhere). ``venv_dir`` is the one place that names
it; ``scripts/install.sh`` asks it where to make it, so an editable checkout, a regular install and a
notebook find the same one. rollforge never imports verifiers: ``build(env)``
(``--env verifiers:<taskset id or path>``) is an ``AgentEnvironment`` whose program is
``_verifiers_worker.py`` run by that venv's python. Per episode the worker loads the taskset,
runs one verifiers episode of the row's task (``vf_task``) with verifiers' own env, harness and
interception, its model client pointed at the episode's gateway session, and prints the sum of
the traces' rewards: verifiers' own score is the episode's reward. Every rule of agent
environments holds (token-exact turns, mask 1 exactly on generated tokens, a failed verifiers
episode fails only its rollforge episode with the worker's one-line reason).

Prompts are the taskset's own tasks (``samples``: the worker lists them, from position ``seed``
on); rows of a data file need a ``vf_task`` column (the task's position in the taskset).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ...errors import ConfigError, EnvironmentError_
from ...types import Message, Sample

FAMILY = "verifiers"
VENV_VARIABLE = "ROLLFORGE_VERIFIERS_VENV"
WORKER = Path(__file__).with_name("_verifiers_worker.py")
_LISTING_TIMEOUT = 300.0


def venv_dir() -> Path:
    """The verifiers virtual environment: ``$ROLLFORGE_VERIFIERS_VENV``, else ``venvs/verifiers`` in
    the active virtual environment (it goes when that one is cleared), else in the user's data folder."""
    if os.environ.get(VENV_VARIABLE):
        return Path(os.environ[VENV_VARIABLE])
    if sys.prefix != sys.base_prefix:  # running in a virtual environment
        return Path(sys.prefix) / "venvs" / "verifiers"
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "rollforge" / "venvs" / "verifiers"


def venv_python() -> str:
    """The verifiers venv's python; a ``ConfigError`` saying how to make it when there is none."""
    python = venv_dir() / "bin" / "python"
    if not python.is_file():
        raise ConfigError(
            f"verifiers environments run in their own virtual environment, and there is none at {venv_dir()}; "
            f"create it with `bash scripts/install.sh` (or point {VENV_VARIABLE} at one with verifiers==0.4.0)"
        )
    return str(python)


def check_env_id(env: str) -> None:
    """A ``ConfigError`` unless ``env`` could name a taskset and the verifiers venv exists."""
    if not isinstance(env, str) or not env.strip():
        raise ConfigError(f"a verifiers environment is a taskset id or a path (verifiers:my_taskset), got {env!r}")
    venv_python()


def command(env: str) -> list[str]:
    """The worker's command for ``env`` (a path made absolute: the worker runs in its own process)."""
    check_env_id(env)
    name = str(Path(env).resolve()) if os.sep in env or env.endswith(".py") else env
    return [venv_python(), str(WORKER), name]


def build(env: str, *, timeout: float = 600.0):
    """An ``AgentEnvironment`` running one verifiers episode per rollforge episode; ``timeout``:
    seconds one episode may take, the worker's start included."""
    from ...gateway.agent import AgentEnvironment  # floor 5, and heavy: only when built (tests/test_layering.py)

    return AgentEnvironment(cmd=command(env), timeout=timeout)


def samples(env: str, n: int, seed: int) -> list[Sample]:
    """``n`` tasks of the taskset, from position ``seed`` on (wrapping around a finite one)."""
    try:
        listed = subprocess.run(
            [*command(env), "tasks", str(n), str(seed)], capture_output=True, text=True, timeout=_LISTING_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentError_(
            f"listing the tasks of verifiers environment {env!r} took over {_LISTING_TIMEOUT:g}s"
        ) from None
    if listed.returncode != 0:
        lines = listed.stderr.strip().splitlines() or ["(no output)"]
        raise ConfigError(f"verifiers environment {env!r} does not load: {lines[-1]}")
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.startswith('{"prompt"')]
    return [
        Sample(prompt=tuple(Message.coerce(m) for m in row.pop("prompt")), task_name=f"{FAMILY}:{env}", row=row)
        for row in rows
    ]
