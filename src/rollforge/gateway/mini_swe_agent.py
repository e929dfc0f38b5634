"""mini-swe-agent on rollforge: its model calls go through the gateway, its shell commands run in
rollforge's sandbox (``envs/sandbox``), never on the host.

- ``gateway_model(base_url, **config)``: mini-swe-agent's own text-based litellm model
  (``LitellmTextbasedModel``: one ```` ```mswea_bash_command ```` block per reply) pointed at an
  episode session's OpenAI-compatible base URL (``AgentEnvironment`` passes it to ``run``);
- ``SandboxShell(cwd=..., env=..., timeout=..., files=..., limits=...)``: a mini-swe-agent
  environment (its ``execute(action, cwd, timeout=)`` contract, the same result dicts and
  ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` convention as its ``LocalEnvironment``). Also usable by
  name from its configs: ``environment_class: rollforge.gateway.mini_swe_agent.SandboxShell``.

Design: every command runs in a fresh jail (no network, no host files, CPU, wall, memory, process
and output limits), and the workspace (``SCRATCH_DIR``, ``/sandbox``) persists between commands as
the agent expects: a small stdlib-only shell runner inside the jail unpacks the previous workspace
(a gzipped tar), runs ``bash -c command`` with stderr merged into stdout under the command's own
timeout, then packs the workspace again and writes it to the sandbox's report channel. The host
keeps the packed workspace as an opaque text (it never unpacks what the agent wrote). A command
that overruns the sandbox's own limits (output cap, wall time) loses its changes to the workspace;
a workspace that packs to more than ``MAX_WORKSPACE_BYTES`` is not kept (the command's output says
so). mini-swe-agent stays an optional import (extra ``agents``); ``LITELLM_LOCAL_MODEL_COST_MAP``
is set before litellm is first imported, so that import never reaches for the network.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from ..envs.sandbox import SCRATCH_DIR, SandboxLimits, run_sandboxed
from ..errors import ConfigError, require

#: Largest packed workspace kept between commands (base64 bytes): under the report channel's cap.
MAX_WORKSPACE_BYTES = 900 << 10
_STATE = ".rollforge-workspace.tgz.b64"
_GRACE_SECONDS = 5.0  # wall time beyond the command's timeout, to pack the workspace
_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

#: The shell runner inside the jail: argv = command, cwd, timeout, workspace cap, state file, workspace.
_RUNNER = """\
import base64, io, json, os, signal, subprocess, sys, tarfile
command, cwd, timeout, cap, state, workspace = sys.argv[1:7]
report = {}
if os.path.exists(state):
    with open(state) as handle:
        packed = base64.b64decode(handle.read())
    os.remove(state)
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        tar.extractall(".", **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))  # filters: 3.10.12+, 3.11.4+
try:
    process = subprocess.Popen(["/bin/bash", "-c", command], cwd=cwd, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        report["returncode"] = process.wait(timeout=float(timeout))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        report["error"] = f"Command {command!r} timed out after {timeout} seconds"
except OSError as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
sys.stdout.flush()
buffer = io.BytesIO()
with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    for name in sorted(os.listdir(workspace)):
        tar.add(os.path.join(workspace, name), arcname=name)
packed = base64.b64encode(buffer.getvalue()).decode()
if len(packed) <= int(cap):
    report["state"] = packed
else:
    report["state_error"] = f"the workspace packs to {len(packed)} bytes, over the {cap} kept between commands"
with os.fdopen(3, "w") as channel:
    json.dump(report, channel)
"""


def _import_minisweagent(module: str) -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm fetches its cost map at import otherwise
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    return require(module, "agents", "mini-swe-agent on rollforge")


def gateway_model(base_url: str, **config: Any) -> Any:
    """mini-swe-agent's ``LitellmTextbasedModel`` talking to rollforge's gateway at ``base_url``.

    ``config``: the ``model`` section of a mini-swe-agent config (``observation_template``,
    ``format_error_template``, ``model_kwargs`` ...); the endpoint, key and cost tracking are set
    here (the gateway's model costs nothing that litellm could price)."""
    models = _import_minisweagent("minisweagent.models.litellm_textbased_model")
    kwargs = dict(config.pop("model_kwargs", None) or {})
    kwargs.update(api_base=base_url, api_key="rollforge")
    config.setdefault("model_name", "openai/rollforge")
    config.setdefault("cost_tracking", "ignore_errors")
    require(
        "litellm", "agents", "mini-swe-agent on rollforge"
    ).suppress_debug_info = True  # its banner per unpriced call
    return models.LitellmTextbasedModel(model_kwargs=kwargs, **config)


class SandboxShell:
    """A mini-swe-agent environment whose commands run in rollforge's sandbox.

    ``cwd``: where commands run (default ``SCRATCH_DIR``, the workspace); ``env``: extra
    environment variables of each command; ``timeout``: seconds a command may run; ``files``: the
    workspace's starting files (relative path -> text); ``limits``: the sandbox's limits per
    command (its wall time is always ``timeout`` plus a few seconds to keep the workspace)."""

    def __init__(
        self,
        *,
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        timeout: int = 30,
        files: Mapping[str, str] | None = None,
        limits: SandboxLimits | None = None,
    ):
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"SandboxShell timeout must be a positive number of seconds, got {timeout!r}")
        if _STATE in (files or {}):
            raise ConfigError(
                f"SandboxShell files may not use the name {_STATE!r}: it holds the workspace between commands"
            )
        self.cwd, self.env, self.timeout = cwd or SCRATCH_DIR, dict(env or {}), timeout
        self.limits = limits or SandboxLimits(cpu_seconds=max(1, int(timeout)))
        self._files: dict[str, str] = dict(files or {})  # the next command's starting workspace
        self.config = {"cwd": self.cwd, "env": self.env, "timeout": timeout}  # what mini-swe-agent reads

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` with bash in a jail holding the workspace; raise mini-swe-agent's
        ``Submitted`` when its output starts with the submit line and it succeeded."""
        command, timeout = action.get("command", ""), timeout or self.timeout
        limits = dataclasses.replace(self.limits, wall_seconds=timeout + _GRACE_SECONDS)
        argv = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            _RUNNER,
            command,
            cwd or self.cwd,
            str(timeout),
            str(MAX_WORKSPACE_BYTES),
            _STATE,
            SCRATCH_DIR,
        ]
        result = run_sandboxed(self._files, argv, limits, env=self.env)
        report = _report(result.report)
        if "state" in report:
            self._files = {_STATE: report["state"]}
        if result.ok and "returncode" in report:
            output = {"output": result.stdout, "returncode": report["returncode"], "exception_info": ""}
        else:
            why = (
                report.get("error")
                or f"the sandbox ended the command ({result.describe()}); its changes to the workspace are lost"
            )
            output = {
                "output": result.stdout + result.stderr,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {why}",
            }
        if "state_error" in report:
            output["exception_info"] = (output["exception_info"] + " " if output["exception_info"] else "") + report[
                "state_error"
            ]
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == _SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            exceptions = _import_minisweagent("minisweagent.exceptions")
            raise exceptions.Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config and the machine's ``uname`` (mini-swe-agent's prompts name the system), not the
        host's environment variables."""
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict:
        environment_type = f"{type(self).__module__}.{type(self).__name__}"
        return {"info": {"config": {"environment": self.config, "environment_type": environment_type}}}


def _report(text: str) -> dict[str, Any]:
    """The runner's report; empty when the jail was stopped before it wrote one."""
    try:
        report = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}
