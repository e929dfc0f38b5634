"""``backends/`` never imports ``cluster/``: Ray replicas are chosen above both (``cluster/generation.py``).

Every import statement in ``src/rollforge/backends/*.py`` is read from the source (including
imports inside functions), so a lazy import upward fails here too; a fresh interpreter opening a
backend through ``open_backend`` loads no ``rollforge.cluster`` module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollforge.backends

BACKENDS = Path(rollforge.backends.__file__).parent


def imported_modules(path: Path) -> list[str]:
    """The absolute names of every module ``path`` imports (relative imports resolved)."""
    package = ["rollforge", "backends"]
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names += [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
    return names


def test_the_reader_resolves_relative_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from ..cluster.replicas import x\nfrom .. import cluster\nimport rollforge.cluster.connect\n"
                      "def f():\n    from ..errors import ConfigError\n")
    assert imported_modules(sample) == [
        "rollforge.cluster.replicas", "rollforge.cluster", "rollforge.cluster.connect", "rollforge.errors",
    ]


def test_no_backend_module_imports_cluster():
    modules = sorted(BACKENDS.glob("*.py"))
    assert len(modules) >= 10 and BACKENDS / "opening.py" in modules
    upward = {
        path.name: name for path in modules for name in imported_modules(path)
        if name == "rollforge.cluster" or name.startswith("rollforge.cluster.")
    }
    assert upward == {}


def test_opening_a_backend_loads_no_cluster_module(tiny_model_dir):
    code = (
        "import asyncio, sys\n"
        "from rollforge.backends.config import BackendConfig\n"
        "from rollforge.backends.opening import open_backend\n"
        f"asyncio.run(open_backend(BackendConfig(model={str(tiny_model_dir)!r})).close())\n"
        "print(sorted(m for m in sys.modules if m.startswith('rollforge.cluster')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
