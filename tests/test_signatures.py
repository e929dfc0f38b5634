"""Short signatures: no public callable of rollforge takes more than 8 parameters, read from the source.

A long parameter list is a bundle that has not been named yet (``policy_update`` took 16, the vLLM
backend 14): the knobs that travel together become a frozen typed value built once, and the
training façades share one typed declaration of their keywords (``TrainOptions``) instead of
repeating them or hiding them in ``**kwargs``.

The count reads the source: every module of ``src/rollforge`` is parsed with ``ast`` (nothing is
imported). Counted: module-level functions and the methods of module-level classes whose names do
not start with ``_``, and ``__init__`` of public classes, in modules whose names do not start with
``_``; ``self``/``cls`` are not counted, ``*args`` and ``**kwargs`` count one each. Config classes
declare fields, not parameters: a class has no ``__init__`` to count unless it writes one.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_type_hints

import pytest
from typing_extensions import Unpack

import rollforge

PACKAGE = Path(rollforge.__file__).parent
LIMIT = 8


def _count(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    """The parameters a caller can pass: ``self``/``cls`` of a method left out (not of a staticmethod),
    ``*args`` and ``**kwargs`` one each."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in function.decorator_list)
    if method and not static and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(args.kwonlyargs) + (args.vararg is not None) + (args.kwarg is not None)


def _public_callables(tree: ast.Module):
    """(qualified name, function node, is a method) of every public callable at the top of a module."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node, False
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    member.name == "__init__" or not member.name.startswith("_")
                ):
                    yield f"{node.name}.{member.name}", member, True


def long_signatures() -> dict[str, int]:
    """``path::name`` -> parameter count of every public callable over ``LIMIT``."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts or (path.name.startswith("_") and path.name != "__init__.py"):
            continue
        where = path.relative_to(PACKAGE.parent).as_posix()
        for name, function, method in _public_callables(ast.parse(path.read_text())):
            if (count := _count(function, method)) > LIMIT:
                found[f"{where}::{name}"] = count
    return found


def test_parameters_are_counted_as_a_caller_passes_them():
    tree = ast.parse(
        "def f(a, /, b, *args, c, **kw): pass\n"
        "def _hidden(a, b, c, d, e, f, g, h, i): pass\n"
        "class A:\n"
        "    def __init__(self, a): pass\n"
        "    def m(self, a, b): pass\n"
        "    @classmethod\n"
        "    def c(cls, a): pass\n"
        "    @staticmethod\n"
        "    def s(self, a): pass\n"
        "    def _private(self, a, b, c, d, e, f, g, h, i): pass\n"
        "class _Hidden:\n"
        "    def m(self, a, b, c, d, e, f, g, h, i): pass\n"
    )
    counts = {name: _count(node, method) for name, node, method in _public_callables(tree)}
    # f: a, b, *args, c, **kw = 5; A.__init__ and A.c drop self/cls; a staticmethod's first is a parameter
    assert counts == {"f": 5, "A.__init__": 1, "A.m": 2, "A.c": 1, "A.s": 2}


def test_no_public_callable_takes_more_than_eight_parameters():
    assert long_signatures() == {}, f"more than {LIMIT} parameters: bundle them in a frozen typed value"


def test_the_run_options_are_declared_once_for_train_atrain_and_open_run():
    """``train``, ``train_rank``, ``atrain`` and ``open_run`` take their options as
    ``**options: Unpack[TrainOptions]`` (PEP 692: one typed declaration that editors show for each),
    and a keyword ``TrainOptions`` does not declare is refused before anything starts."""
    from rollforge.recipes import launch
    from rollforge.train import run_setup
    from rollforge.train.config import TrainConfig

    for function in (launch.train, launch.train_rank, launch.atrain, run_setup.open_run):
        assert get_type_hints(function)["options"] == Unpack[run_setup.TrainOptions], function.__name__
    assert list(run_setup.TrainOptions.__annotations__) == [
        "environments",
        "dataset",
        "reward_functions",
        "resume",
        "overwrite",
        "console",
        "on_step",
        "backend",
    ]
    with pytest.raises(TypeError, match=r"^train\(\) got an unexpected keyword argument 'consol'; expected one of "):
        launch.train(TrainConfig(), consol=False)
