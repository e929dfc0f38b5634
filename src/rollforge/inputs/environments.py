"""Environments named in a training config or given as objects, built into the engine's
``task_to_env`` mapping.

A name is a bundled environment (``arithmetic``), a member of a family (``gymnasium:<env id>``:
a family's name is never read as a module, so a bad id gets the family's own error), the URL of an OpenEnv server
(``http://127.0.0.1:8000``: one WebSocket session per episode), or ``module:attribute`` /
``path/to/file.py:attribute``. The attribute, or an object given directly (``train(config,
environments={"name": obj})``), may be an ``Environment`` (used as is), a class or object with a
NeMo-RL-style ``step(message_logs, metadata)`` (wrapped in ``StepwiseEnvironment``), a dict
``{name: factory}`` or any other class or zero-argument callable (TRL-style, wrapped in
``FactoryEnvironment``).

A ``file.py`` is imported once per process, under its ordinary module name when its folder is on
``sys.path`` (so ``file.py:MyEnv`` in a config and ``from file import MyEnv`` in reward code are the
same class and ``isinstance`` holds), else under a private name.

``check_routes`` (``envs/factory.py``, re-exported here; the rollout engine runs it too) refuses,
before any generation, a prompt whose ``environment`` column names neither a factory of its dict of
factories nor a configured environment.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from ..envs.base import Environment
from ..envs.factory import FactoryEnvironment, check_routes
from ..envs.library import get_env_spec, is_family_member
from ..envs.stepwise import StepwiseEnvironment
from ..errors import ConfigError
from .config import EnvConfig

__all__ = [
    "as_environment",
    "build_environments",
    "check_routes",
    "import_attribute",
    "is_bundled",
    "named_environments",
    "task_name",
]


def task_name(config: EnvConfig) -> str:
    if config.task_name:
        return config.task_name
    if _is_url(config.name):
        return "openenv"
    return config.name if is_bundled(config.name) else config.name.rpartition(":")[2]


def _is_url(name: str) -> bool:
    return name.startswith(("http://", "https://", "ws://", "wss://"))


def is_bundled(name: str) -> bool:
    """A bundled environment or family member (``reasoning_gym:leg_counting``), not an import path.
    A family's name decides, valid item or not, so that the family's own error (an unknown id, no
    text rendering, a missing library) reaches the user when the environment is built."""
    return ":" not in name or is_family_member(name)


def build_environments(configs: list[EnvConfig], given: Mapping[str, Any] | None = None) -> dict[str, Environment]:
    """``task_to_env`` from the configured names, then the ``given`` objects (task name -> object)."""
    if not configs and not given:
        raise ConfigError("no environments configured: give at least one under 'environments'")
    out: dict[str, Environment] = {}
    named = [(task_name(c), c.name) for c in configs] + list((given or {}).items())
    for name, target in named:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"environment task names must be non-empty strings, got {name!r}")
        if name in out:
            raise ConfigError(f"two environments have the task name {name!r}; set task_name on one of them")
        out[name] = _build(target) if isinstance(target, str) else as_environment(target, f"environment {name!r}")
    return out


def named_environments(given: Any) -> dict[str, Any]:
    """``train(environments=...)``: a mapping task name -> object, or one object (a class, factory or
    ``Environment``) named after itself."""
    if isinstance(given, Mapping):
        return dict(given)
    name = getattr(given, "__name__", None) or type(given).__name__
    return {name: given}


def _build(name: str) -> Environment:
    if _is_url(name):
        from ..envs.openenv import OpenEnvEnvironment

        return OpenEnvEnvironment(name)
    if is_bundled(name):
        return get_env_spec(name).build()
    return as_environment(import_attribute(name), repr(name))


def as_environment(target: Any, label: str) -> Environment:
    """An object (see the module docstring) as an ``Environment``."""
    if isinstance(target, Environment) and not inspect.isclass(target):
        return target
    if isinstance(target, Mapping):
        return FactoryEnvironment(target)
    if inspect.isclass(target) and callable(getattr(target, "step", None)) and not hasattr(target, "reset"):
        return StepwiseEnvironment(target())
    if not inspect.isclass(target) and callable(getattr(target, "step", None)):
        return StepwiseEnvironment(target)
    if callable(target):
        return FactoryEnvironment(target)
    raise ConfigError(f"{label} is a {type(target).__name__}; expected an environment class, factory or Environment")


def import_attribute(path: str) -> Any:
    """``module:attribute`` or ``path/to/file.py:attribute`` (relative to the working directory;
    dots allowed in the attribute) -> the object."""
    module_name, sep, attribute = path.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{path!r} must look like 'module:attribute' or 'file.py:attribute'")
    try:
        target: Any = _import_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from None
    except SyntaxError as exc:
        raise ConfigError(
            f"cannot import module {module_name!r} (from {path!r}): {exc.msg} ({exc.filename}, line {exc.lineno})"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            near = difflib.get_close_matches(part, [n for n in dir(target) if not n.startswith("_")], n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ConfigError(f"module {module_name!r} has no attribute {attribute!r} (from {path!r}){hint}")
        target = getattr(target, part)
    return target


def _import_file(filename: str) -> Any:
    """The module of ``filename``, imported once (see the module docstring)."""
    file = Path(filename).resolve()
    if not file.is_file():
        raise ImportError(f"no such file {str(file)!r}")
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and os.path.basename(path) == file.name and Path(path).resolve() == file:
            return module
    name = _module_name(file)
    if name is not None:
        try:
            module = importlib.import_module(name)
        except ImportError:
            module = None
        if module is not None and Path(getattr(module, "__file__", "") or "").resolve() == file:
            return module
    # not importable by its own name (shadowed, or not an identifier): a private name per path
    name = f"rollforge_user_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing: dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _module_name(file: Path) -> str | None:
    """The dotted name ``file`` has under a ``sys.path`` entry; its folder is appended to
    ``sys.path`` when none holds it (as ``python file.py`` would put it first), so that the files
    beside it import each other as usual."""
    names = []
    for entry in list(sys.path):
        base = Path(entry or os.getcwd()).resolve()
        if base in file.parents:
            parts = file.relative_to(base).with_suffix("").parts
            if all(part.isidentifier() for part in parts):
                names.append(".".join(parts))
    if names:
        return min(names, key=lambda name: name.count("."))  # the nearest entry, as users import it
    if not file.stem.isidentifier():
        return None
    sys.path.append(str(file.parent))
    return file.stem
