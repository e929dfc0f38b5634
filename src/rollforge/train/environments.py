"""Environments named in a training config, built into the engine's ``task_to_env`` mapping.

A name is a bundled environment (``arithmetic``), the URL of an OpenEnv server
(``http://127.0.0.1:8000``: one WebSocket session per episode), or ``module:attribute``. The attribute may
be an ``Environment`` (used as is), a class or object with a NeMo-RL-style ``step(message_logs,
metadata)`` (wrapped in ``StepwiseEnvironment``), a dict ``{name: factory}`` or any other class or
zero-argument callable (TRL-style, wrapped in ``FactoryEnvironment``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Mapping

from ..envs.base import Environment
from ..envs.factory import FactoryEnvironment
from ..envs.library import get_env_spec
from ..envs.stepwise import StepwiseEnvironment
from ..errors import ConfigError
from .config import EnvConfig


def task_name(config: EnvConfig) -> str:
    if config.task_name:
        return config.task_name
    if _is_url(config.name):
        return "openenv"
    return config.name if is_bundled(config.name) else config.name.rpartition(":")[2]


def _is_url(name: str) -> bool:
    return name.startswith(("http://", "https://", "ws://", "wss://"))


def is_bundled(name: str) -> bool:
    """A bundled environment or family member (``reasoning_gym:leg_counting``), not an import path."""
    if ":" not in name:
        return True
    if _is_url(name):
        return False
    try:
        get_env_spec(name)
    except ConfigError:
        return False
    return True


def build_environments(configs: list[EnvConfig]) -> dict[str, Environment]:
    if not configs:
        raise ConfigError("no environments configured: give at least one under 'environments'")
    out: dict[str, Environment] = {}
    for config in configs:
        name = task_name(config)
        if name in out:
            raise ConfigError(f"two environments have the task name {name!r}; set task_name on one of them")
        out[name] = _build(config.name)
    return out


def _build(name: str) -> Environment:
    if _is_url(name):
        from ..envs.openenv import OpenEnvEnvironment

        return OpenEnvEnvironment(name)
    if is_bundled(name):
        return get_env_spec(name).build()
    target = import_attribute(name)
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
    raise ConfigError(f"{name!r} is a {type(target).__name__}; expected an environment class, factory or Environment")


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
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"module {module_name!r} has no attribute {attribute!r} (from {path!r})")
        target = getattr(target, part)
    return target


def _import_file(filename: str) -> Any:
    file = Path(filename).resolve()
    if not file.is_file():
        raise ImportError(f"no such file {str(file)!r}")
    name = f"rollforge_user_{file.stem}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(file):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before executing: dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module
