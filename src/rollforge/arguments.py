"""Checks of what public constructors are given, so that a natural first mistake is answered with
one ``ConfigError`` line that names what was expected, not a traceback from deep inside.

The mistakes covered are the ones a new user makes: the ``(model, tokenizer)`` pair that
``load_model`` returns passed as one of them (the answer says how to unpack it), a model name where
a loaded object is expected or the reverse, and arguments given in the wrong order. The checks test
what the callee uses (duck typing), never exact classes, so test doubles still pass.
"""

from __future__ import annotations

from os import PathLike
from typing import Any

from .errors import ConfigError

#: Said whenever the pair that ``load_model`` returns is passed as one object.
UNPACK_HINT = "rollforge.load_model returns (model, tokenizer): model, tokenizer = rollforge.load_model(name)"


def check_model(model: Any, owner: str) -> None:
    """A loaded transformers model (``PreTrainedModel``)."""
    if isinstance(model, tuple):
        raise ConfigError(f"{owner}: model is a tuple; expected a loaded transformers model ({UNPACK_HINT})")
    if not (hasattr(model, "config") and callable(getattr(model, "parameters", None))):
        hint = "; load it with rollforge.load_model(name)" if isinstance(model, (str, PathLike)) else ""
        raise ConfigError(f"{owner}: model must be a loaded transformers model, got {describe(model)}{hint}")


def check_tokenizer(tokenizer: Any, owner: str, needs: tuple[str, ...] = ("encode", "decode")) -> None:
    """A tokenizer that has the attributes ``needs`` (a Hugging Face tokenizer has them all)."""
    if isinstance(tokenizer, tuple):
        raise ConfigError(f"{owner}: tokenizer is a tuple; expected a Hugging Face tokenizer ({UNPACK_HINT})")
    missing = [name for name in needs if not hasattr(tokenizer, name)]
    if missing:
        raise ConfigError(
            f"{owner}: tokenizer must be a Hugging Face tokenizer (rollforge.load_model(name)[1]), "
            f"got {describe(tokenizer)}, which has no {missing[0]}"
        )


def check_model_name(model: Any, owner: str) -> None:
    """A model name, hub id or local directory (a backend that loads the model itself)."""
    if isinstance(model, tuple):
        raise ConfigError(f"{owner}: model is a tuple; expected a model name or directory (not load_model's result)")
    if not isinstance(model, (str, PathLike)):
        raise ConfigError(f"{owner}: model must be a model name, hub id or directory, got {describe(model)}")


def describe(value: Any) -> str:
    """A value's type, with its repr when that is short (a name, a number), for one-line messages."""
    if isinstance(value, (str, int, float, PathLike)) or value is None:
        return f"{type(value).__name__} {value!r:.60}"
    return type(value).__name__
