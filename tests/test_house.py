"""Sizes: no module over 400 lines, no function over 60 lines, read from the source.

Counted as ``/work/shared/tools/house.py`` counts: a module's lines are its newlines; a function's
are from its ``def`` line to its last line (decorators not counted), methods and nested functions
included. Today's offenders are listed with their current size in ``KNOWN``: one may shrink, not
grow past its listed size, and once it is within the limit it must leave the list, so the list can
only shrink. The sizes are those of formatted code: ``ruff format --check`` passes on ``src``,
``tests`` and ``scripts`` (``[tool.ruff]`` in pyproject.toml; ruff comes with the ``test`` extra).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rollforge

PACKAGE = Path(rollforge.__file__).parent
REPO = Path(__file__).resolve().parents[1]
MODULE_LIMIT = 400
FUNCTION_LIMIT = 60

#: Offenders allowed for now, with their sizes: ``path`` (a module) or ``path::qualified.name``
#: (a function). Empty: every module is within 400 lines and every function within 60.
KNOWN: dict[str, int] = {}


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function under ``node``, methods and nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                yield name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from _functions(child, name + ".")
        else:
            yield from _functions(child, prefix)


def sizes() -> dict[str, int]:
    """Every module's and every function's size, keyed as ``KNOWN`` is."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        text = path.read_text()
        where = path.relative_to(PACKAGE.parent).as_posix()
        found[where] = text.count("\n")
        for name, lines in _functions(ast.parse(text)):
            key = f"{where}::{name}"
            found[key] = max(found.get(key, 0), lines)  # a name defined twice (if/else): the longer
    return found


def _limit(key: str) -> int:
    return FUNCTION_LIMIT if "::" in key else MODULE_LIMIT


def test_qualified_names_and_lengths_are_counted_as_house_counts():
    tree = ast.parse(
        "class A:\n    def f(self):\n        def g():\n            pass\n\n        return g\nasync def h():\n    pass\n"
    )
    assert dict(_functions(tree)) == {"A.f": 5, "A.f.g": 2, "h": 2}


def test_no_module_or_function_grows_past_its_limit():
    over = {key: size for key, size in sizes().items() if size > KNOWN.get(key, _limit(key))}
    assert over == {}, "over the limit (or past the size listed in KNOWN)"


def test_the_known_offenders_are_still_offenders():
    found = sizes()
    fixed = {key: found.get(key) for key in KNOWN if found.get(key, 0) <= _limit(key)}
    assert fixed == {}, "within the limit now (or gone): remove them from KNOWN"


def _ruff() -> list[str]:
    """The ruff beside this interpreter (a virtual environment's ``bin``), else its module."""
    beside = Path(sys.executable).with_name("ruff")
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "ruff"]


def test_the_code_is_formatted_as_ruff_formats_it():
    done = subprocess.run(
        [*_ruff(), "format", "--check", "src", "tests", "scripts"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, f"ruff format --check src tests scripts:\n{done.stdout}{done.stderr}"


def private_imports(tree: ast.AST) -> list[str]:
    """Names starting with one underscore that ``tree`` imports from rollforge's own modules
    (relative imports, or ``rollforge.``); dunders such as ``__version__`` are public."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        ours = node.level > 0 or (node.module or "").split(".")[0] == "rollforge"
        for alias in node.names if ours else ():
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                found.append(f"{'.' * node.level}{node.module or ''}:{alias.name}")
    return found


def test_private_imports_are_found_in_relative_and_absolute_forms():
    tree = ast.parse(
        "from .wire import Choice, _integer\nfrom rollforge.x import _y as z\nfrom os import _exit\n"
        "from . import __version__\nfrom .a import b as _b\n"
    )
    assert private_imports(tree) == [".wire:_integer", "rollforge.x:_y"]


def test_no_private_name_is_imported_across_modules():
    crossing = {
        path.relative_to(PACKAGE.parent).as_posix(): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in path.parts and (names := private_imports(ast.parse(path.read_text())))
    }
    assert crossing == {}
