"""The sandbox started from a console script of a virtual environment made with ``python -m venv``.

A console script (``<venv>/bin/rollforge``) puts its own folder first on ``sys.path``; the sandbox
hides ``sys.path`` folders, and ``<venv>/bin/python3`` is a link whose target's folder was the only
one kept visible, so every sandboxed run failed with "could not start the program". The venv is
made here, in the test's temporary folder, seeing this environment's packages through a ``.pth``
file; the same venv's ``python -c`` is the control (the ``python -m rollforge`` way that worked).
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

import rollforge
from rollforge.envs.sandbox import runner, sandbox_support

PROBE = "from rollforge.envs.sandbox import sandbox_support; print(sandbox_support())"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    if not sys.platform.startswith("linux"):
        pytest.skip("the sandbox needs Linux")
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    packages = [p for p in site.getsitepackages() if os.path.isdir(p)]
    source = str(Path(rollforge.__file__).resolve().parents[1])
    (site_packages,) = root.glob("lib/python*/site-packages")
    (site_packages / "parent.pth").write_text("\n".join([source, *packages]) + "\n")
    return root


def script(venv: Path, name: str, body: str) -> Path:
    """A console script as pip writes one: the venv's interpreter in the shebang."""
    path = venv / "bin" / name
    path.write_text(f"#!{venv / 'bin' / 'python3'}\n{body}\n")
    path.chmod(0o755)
    return path


def run(argv: list, cwd: Path) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


def control(venv: Path, tmp_path: Path) -> None:
    """Skip unless the sandbox works from this venv's interpreter run as ``python -c``."""
    reason = run([str(venv / "bin" / "python3"), "-c", PROBE], tmp_path).stdout.strip()
    if reason != "None":
        pytest.skip(f"no sandbox here even without a console script: {reason}")


def test_the_sandbox_starts_from_a_console_script(venv, tmp_path):
    control(venv, tmp_path)
    probe = script(venv, "probe", f"import sys\nprint(sys.path[0])\n{PROBE}")
    result = run([str(probe)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(venv / "bin"), "None"]


def test_the_sandbox_starts_when_python_lives_under_work(venv, tmp_path):
    # /work (a common Docker WORKDIR; here, the project's .venv) was the jail's scratch folder, and
    # the jail refused to start when a folder it binds lay under it. Only where Python lives there.
    if not any(path == "/work" or path.startswith("/work/") for path in runner._binds()):
        pytest.skip(f"this Python ({sys.prefix}) does not live under /work")
    control(venv, tmp_path)
    assert sandbox_support() is None


@pytest.mark.slow
def test_the_rollforge_console_script_runs_a_python_code_episode(venv, tmp_path, tiny_model_dir):
    control(venv, tmp_path)
    rollforge_script = script(venv, "rollforge", "import sys\nfrom rollforge.cli.main import main\nsys.exit(main())")
    result = run(
        [
            str(rollforge_script),
            "rollout",
            "--model",
            str(tiny_model_dir),
            "--env",
            "python_code",
            "--episodes",
            "1",
            "--max-turns",
            "1",
            "--max-new-tokens",
            "8",
            "--out",
            str(tmp_path / "out"),
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("1 episode, "), result.stdout
