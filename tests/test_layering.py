"""The house's floors, read from the source's imports: no module imports from a floor above its own,
and no import circle outside ``if TYPE_CHECKING:``.

Every module of ``src/rollforge`` is parsed with ``ast`` (nothing is imported); every import
statement counts, including imports inside functions (a lazy import upward fails here too), except
those under ``if TYPE_CHECKING:``. The floor map (``FLOORS``) is the picture of
``/work/shared/ARCHITECTURE.md`` as the code is today, written down once. Today's violations that
other work will remove are listed in ``KNOWN_UPWARD`` and ``KNOWN_CIRCLES``; a listed violation
that no longer exists fails the test too, so the lists can only shrink.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollforge

PACKAGE = Path(rollforge.__file__).parent

#: Each module's floor: the longest key that is the module or a package holding it. A module may
#: import from its own floor and the floors below.
FLOORS = {
    # bottom: the exception tree, and the frozen values (with the JSON forms they are written in)
    "rollforge.errors": 0,
    "rollforge.json_forms": 0,
    "rollforge.seeds": 0,
    "rollforge.files": 0,
    "rollforge.ports": 0,
    "rollforge.heap": 0,
    "rollforge.invariants": 0,
    "rollforge.endings": 0,
    "rollforge.placement": 0,
    "rollforge.completion": 0,
    "rollforge.types": 1,
    # boundary: classify failures at each boundary; rollforge's own bugs propagate
    "rollforge.boundary": 2,
    # parts: the helpers the parts share, then the parts
    "rollforge.arguments": 3,
    "rollforge.models": 3,
    "rollforge.images": 3,
    "rollforge.workers": 3,
    "rollforge.chat": 4,
    "rollforge.backends": 4,
    "rollforge.envs": 4,
    # orchestration
    "rollforge.rollout": 5,
    "rollforge.gateway": 5,
    "rollforge.cluster": 5,
    # run inputs: environments and prompts read once (read_inputs), their config sections, evaluation
    "rollforge.inputs": 6,
    # training (the library: losses, update, advantages, config, run, ...)
    "rollforge.train": 7,
    # recipes: the GRPO loops, launch, SFT and the quickstart, built from the library
    "rollforge.recipes": 8,
    # top: the public API, the commands, the benchmarks, the viewer, exports, test helpers
    "rollforge": 9,
    "rollforge.__main__": 9,
    "rollforge.cli": 9,
    "rollforge.bench": 9,
    "rollforge.view": 9,
    "rollforge.export": 9,
    "rollforge.testing": 9,
}

#: Parts on one floor that must not know each other (importer package -> packages it never imports).
APART = {
    # token ids in, token ids and logprobs out: no environments, no chat templates, no Ray
    "rollforge.backends": ("rollforge.envs", "rollforge.chat", "rollforge.cluster"),
}

#: Upward imports of today, (importer, imported), each to be removed by the work named.
KNOWN_UPWARD: set[tuple[str, str]] = {
    # the verifiers family (envs/library, floor 4) builds an AgentEnvironment (gateway, floor 5),
    # imported inside build() only; removed when agent programs get a floor-4 contract the
    # engine hands a gateway to, or families can be registered from the gateway's floor
    ("rollforge.envs.adapters.verifiers_env", "rollforge.gateway.agent"),
}

#: Import circles of today, each to be removed by the work named.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of every node under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                hidden.update(id(sub) for child in node.body for sub in ast.walk(child))
    return hidden


def imported_names(source: str, module: str, is_package: bool, type_checking: bool = False) -> list[str]:
    """The absolute names ``source`` (the text of ``module``) imports (under ``TYPE_CHECKING`` too
    only with ``type_checking``): for ``from X import a`` both ``X`` and ``X.a`` (``a`` may be a module)."""
    tree = ast.parse(source)
    hidden = set() if type_checking else _type_checking_nodes(tree)
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - node.level + 1] if node.level else []
            start = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names += [start] + [f"{start}.{alias.name}" for alias in node.names]
    return names


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the rollforge modules it imports (its own package's ``__init__`` excepted: a module
    reaching its package's face is how packages hold together, not an arrow between floors)."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        graph[module] = set()
        for name in imported_names(path.read_text(), module, path.name == "__init__.py", type_checking):
            while name and name not in paths:  # the longest module that name is or lies inside
                name = name.rpartition(".")[0]
            if name and name != module and not (paths[name].name == "__init__.py" and module.startswith(name + ".")):
                graph[module].add(name)
    return graph


def floor(module: str) -> int | None:
    keys = [k for k in FLOORS if k != "rollforge" and (module == k or module.startswith(k + "."))]
    if keys:
        return FLOORS[max(keys, key=len)]
    return FLOORS["rollforge"] if module == "rollforge" else None


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_the_reader_resolves_relative_imports_and_skips_type_checking():
    source = (
        "from ..cluster.replicas import x\nfrom .. import cluster\nimport rollforge.cluster.connect\n"
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..train import loop\n"
        "def f():\n    from ..errors import ConfigError\n"
    )
    assert imported_names(source, "rollforge.backends.sample", False) == [
        "rollforge.cluster.replicas",
        "rollforge.cluster.replicas.x",
        "rollforge",
        "rollforge.cluster",
        "rollforge.cluster.connect",
        "typing",
        "typing.TYPE_CHECKING",
        "rollforge.errors",
        "rollforge.errors.ConfigError",
    ]
    assert imported_names("from . import base\n", "rollforge.envs", True) == ["rollforge.envs", "rollforge.envs.base"]
    assert "rollforge.train" in imported_names(source, "rollforge.backends.sample", False, type_checking=True)


def test_the_circle_finder_finds_each_circle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"g"}}
    assert circles(graph) == {frozenset("abc"), frozenset("ef")}


def test_every_module_stands_on_a_floor():
    graph = import_graph()
    assert len(graph) >= 100 and "rollforge.rollout.episode" in graph
    assert [m for m in sorted(graph) if floor(m) is None] == []


def test_no_module_imports_from_a_floor_above_its_own():
    upward = {(m, t) for m, targets in import_graph().items() for t in targets if floor(t) > floor(m)}
    assert upward - KNOWN_UPWARD == set(), "new upward imports"
    assert KNOWN_UPWARD - upward == set(), "gone: remove them from KNOWN_UPWARD"


def test_parts_on_one_floor_that_must_not_know_each_other_do_not():
    """Not even for type checking (``backends/`` never imports ``cluster/``: Ray replicas are chosen
    above both, in ``cluster/generation.py``)."""
    crossing = {
        (m, t)
        for m, targets in import_graph(type_checking=True).items()
        for t in targets
        for package, apart in APART.items()
        if (m == package or m.startswith(package + ".")) and any(t == a or t.startswith(a + ".") for a in apart)
    }
    assert crossing == set()


def test_no_import_circle_outside_type_checking():
    found = circles(import_graph())
    assert found - KNOWN_CIRCLES == set(), "new import circles"
    assert KNOWN_CIRCLES - found == set(), "gone: remove them from KNOWN_CIRCLES"


def test_the_rollout_command_never_enters_train_nor_the_recipes():
    """``rollforge rollout`` reads its environments and prompts in ``inputs/``: nothing it imports,
    directly or through another module, lies in ``train/`` or ``recipes/``."""
    graph, reached, todo = import_graph(), set(), ["rollforge.cli.rollout"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph[module]
    assert "rollforge.inputs.read" in reached
    assert sorted(m for m in reached if m.startswith(("rollforge.train", "rollforge.recipes"))) == []


def test_opening_a_backend_loads_no_cluster_module(tiny_model_dir):
    """A fresh interpreter opening a backend through ``open_backend`` loads no ``rollforge.cluster`` module."""
    code = (
        "import asyncio, sys\n"
        "from rollforge.backends.config import BackendConfig\n"
        "from rollforge.backends.opening import open_backend\n"
        f"asyncio.run(open_backend(BackendConfig(model={str(tiny_model_dir)!r})).close())\n"
        "print(sorted(m for m in sys.modules if m.startswith('rollforge.cluster')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
