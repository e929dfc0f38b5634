"""The verifiers worker: runs INSIDE the verifiers virtual environment, by path (stdlib + verifiers).

``python _verifiers_worker.py ENV tasks N SEED`` prints ``N`` rows of the environment's taskset
(JSON lines ``{"prompt": [...], "vf_task": idx}``, the tasks from position ``SEED`` on, wrapping
around a finite taskset); ``python _verifiers_worker.py ENV`` reads one such row (JSON on stdin),
runs one episode of task ``vf_task`` with the model client pointed at ``OPENAI_BASE_URL`` (the
rollforge gateway session) and prints ``{"reward": x}``: the sum of the episode's traces' rewards,
verifiers' own scoring. A failed episode (verifiers' ``ok`` false) prints its error as one line on
stderr and exits 1.

``ENV`` is a verifiers v0.4 taskset id (an importable module exporting a ``Taskset`` subclass
through ``__all__``, and optionally its ``Env`` and ``Harness``), or a path to such a ``.py`` file
or package directory. This process never imports rollforge (verifiers pins ``openai<3`` and
``mcp==2.0.0``, which rollforge's own environment cannot hold). Every seat of the env (``agent``
for a plain taskset) runs its harness in verifiers' ``subprocess`` runtime, on this machine (its
default runtime is a remote Prime sandbox, which needs an account and the network), so a seat
whose harness nobody chose gets verifiers' chat-only ``null`` harness (the taskset's tools, no
shell) instead of ``bash``, and a harness that runs the model's code is refused unless
``ROLLFORGE_VERIFIERS_HOST_CODE=1`` allows it (``_local_seat``).

Harness programs are PEP 723 scripts that verifiers provisions with ``uv``; when every package a
script declares is already importable here (true of the built-in chat program: its packages are
verifiers' own dependencies), the script runs with this interpreter instead, offline.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import itertools
import json
import os
import re
import sys
import tempfile
from pathlib import Path

HOST_CODE = "ROLLFORGE_VERIFIERS_HOST_CODE"


def _taskset_id(env: str) -> str:
    """The importable taskset id of ``env``: a file or directory path is imported from its folder,
    an id from the installed packages or the working directory."""
    path = Path(env)
    is_path = env.endswith(".py") or os.sep in env or path.is_dir()
    if is_path and not path.exists():
        raise SystemExit(f"verifiers environment {env!r}: no such file or directory")
    folder = str(path.resolve().parent) if is_path else os.getcwd()
    sys.path.insert(0, folder)  # and for the processes verifiers starts (tool servers: python -m module)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (folder, os.environ.get("PYTHONPATH"))))
    return (path.stem if path.suffix == ".py" else path.name) if is_path else env


def _declared_packages(script: str) -> list[str]:
    match = re.search(r"^# dependencies = \[(.*?)\]$", script, re.M)
    names = re.findall(r'"([A-Za-z0-9_.\-]+)', match.group(1)) if match else []
    return [name.replace("-", "_").lower() for name in names]


def _run_scripts_here() -> None:
    """Run PEP 723 harness scripts with this interpreter when it already has their packages."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    provision = SubprocessRuntime.prepare_uv_script

    async def prepare(self, script, env=None, *, activate=True):
        text = script.decode() if isinstance(script, bytes) else script
        if not all(importlib.util.find_spec(name) for name in _declared_packages(text)):
            return await provision(self, script, env, activate=activate)
        path = Path(tempfile.gettempdir()) / f"vf-script-{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
        if not path.exists():  # written whole, then renamed: concurrent episodes share the file
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text)
            os.replace(partial, path)
        return [sys.executable, str(path)]

    SubprocessRuntime.prepare_uv_script = prepare


def _local_seat(vf, taskset: str, seat: str, pinned) -> dict:
    """What rollforge sets in a seat's config (verifiers merges it onto the env's own, so the
    seat's other settings stay): the ``subprocess`` runtime, on this machine, and the harness the
    env pins, else the taskset's own, else verifiers' chat-only ``null`` (its default ``bash``
    runs the model's shell commands, meant for a remote sandbox). A harness that runs the model's
    code is refused unless ``ROLLFORGE_VERIFIERS_HOST_CODE=1`` allows it on this machine."""
    from verifiers.v1.utils.loaders import harness_class

    ident = pinned.id if pinned is not None else vf.default_harness_id(taskset)
    ident = "null" if pinned is None and ident == "bash" else ident
    if harness_class(ident).EXECUTES_CODE and os.environ.get(HOST_CODE) != "1":
        raise SystemExit(
            f"the verifiers harness {ident!r} (seat {seat!r}) runs the model's code, and rollforge runs "
            f"verifiers harnesses on this machine; set {HOST_CODE}=1 to allow it"
        )
    return {"runtime": {"type": "subprocess"}, **({"harness": {"id": ident}} if pinned is None else {})}


def _load(env: str):
    import verifiers.v1 as vf

    taskset = _taskset_id(env)
    fields = vf.env_config_type(taskset).model_fields.items()
    seats = {
        name: _local_seat(vf, taskset, name, field.default.harness)
        for name, field in fields
        if isinstance(field.default, vf.AgentConfig)
    }
    return vf, vf.load_environment(vf.resolve_env_config({"taskset": {"id": taskset}, **seats}))


def _prompt(task) -> list[dict]:
    data = task.data
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        messages += [
            m.model_dump(mode="json", exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in data.prompt
        ]
    return messages


def _tasks(env: str, n: int, seed: int) -> None:
    _, environment = _load(env)
    taskset = environment.taskset
    tasks = list(taskset) if taskset.bounded else list(itertools.islice(taskset, seed + n))
    if not tasks:
        raise SystemExit(f"verifiers environment {env!r} has no tasks")
    for i in range(n):
        position = (seed + i) % len(tasks)
        print(json.dumps({"prompt": _prompt(tasks[position]), "vf_task": position}))


async def _episode(env: str, row: dict) -> float:
    vf, environment = _load(env)
    if not isinstance(row.get("vf_task"), int):
        raise SystemExit(
            f"a row of verifiers environment {env!r} needs vf_task (the task's position in the taskset), got {row.get('vf_task')!r}"
        )
    position = row["vf_task"]
    task = next(itertools.islice(environment.taskset, position, position + 1), None)
    if task is None:
        raise SystemExit(f"verifiers environment {env!r} has no task at position {position}")
    client = vf.EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY")
    context = vf.ModelContext(model=os.environ.get("ROLLFORGE_MODEL", "rollforge"), client=client)
    async with environment.serving():
        [slot] = environment.slots(task, 1)
        episode = await environment.run_slot(slot, context)
    if not episode.ok:
        errors = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
        error = errors[-1] if errors else None
        reason = f"{error.type}: {error.message}" if error is not None else "no error recorded"
        raise SystemExit(f"the verifiers episode failed: {' '.join(reason.split())[:2000]}")
    return float(sum(trace.reward for trace in episode.traces))


def main(argv: list[str]) -> int:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # this folder holds rollforge's modules, never verifiers'
    _run_scripts_here()
    if len(argv) == 4 and argv[1] == "tasks":
        _tasks(argv[0], int(argv[2]), int(argv[3]))
        return 0
    if len(argv) != 1:
        raise SystemExit("usage: _verifiers_worker.py ENV [tasks N SEED]  (one row as JSON on stdin)")
    reward = asyncio.run(_episode(argv[0], json.loads(sys.stdin.read() or "{}")))
    print(json.dumps({"reward": reward}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
