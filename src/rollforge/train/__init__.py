"""GRPO training: ``from rollforge.train import train, load_config``.

This package is the training library (config, rewards, advantages, losses, update, policy,
checkpoint, ``run``: what both loops share); the loops that use it are the recipes
(``rollforge.recipes``), and ``train``, ``atrain`` and ``TrainResult`` below are
``recipes/launch.py``'s. The names are imported on first use (PEP 562), so that importing a light
submodule such as ``rollforge.train.config`` does not pull in torch and the training loop.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "train": ("rollforge.recipes.launch", "train"),
    "atrain": ("rollforge.recipes.launch", "atrain"),
    "TrainResult": ("rollforge.recipes.launch", "TrainResult"),
    "TrainConfig": ("rollforge.train.config", "TrainConfig"),
    "load_config": ("rollforge.train.config", "load_config"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'rollforge.train' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
