"""The rollforge exception tree.

Every error rollforge raises on purpose derives from ``RollforgeError`` and is named after the
boundary that failed::

    RollforgeError
    ├── ConfigError          bad user input: options, environment names, task names, arguments
    ├── ModelError           a model or tokenizer cannot be resolved or loaded
    ├── TemplateError        a chat template cannot be rendered incrementally (not prefix-preserving)
    ├── MissingDependency    an optional dependency is not installed (names the extra to install)
    ├── BackendError         a generation backend failed a request
    ├── EnvironmentError_    an environment raised, timed out or broke its contract
    ├── InvariantError       a trajectory broke an internal invariant (a rollforge bug)
    └── CheckpointError      a training checkpoint is missing, incomplete or unreadable

Errors that happen *inside* an episode (a tool that raises, a hanging environment, a backend that
fails one request) never propagate out of the engine: they are recorded on the trajectory as a
``Failure`` (see ``types.py``) and the rest of the batch goes on.
"""

from __future__ import annotations


class RollforgeError(Exception):
    """Root of every error rollforge raises on purpose."""


class ConfigError(RollforgeError, ValueError):
    """Bad user input: the message names the bad value and what was expected."""


class ModelError(RollforgeError):
    """A model or tokenizer cannot be resolved or loaded."""


class TemplateError(RollforgeError):
    """A chat template cannot be rendered incrementally for the conversation shapes in use."""


class MissingDependency(RollforgeError, ImportError):
    """An optional dependency is missing; the message names the extra that installs it."""

    def __init__(self, package: str, extra: str, feature: str):
        super().__init__(
            f"{feature} needs the optional dependency {package!r}, which is not installed; "
            f"install it with: pip install 'rollforge[{extra}]'"
        )
        self.package = package
        self.extra = extra


class BackendError(RollforgeError):
    """A generation backend failed a request."""


class EnvironmentError_(RollforgeError):
    """An environment raised, timed out or broke its contract (trailing underscore: the builtin
    ``EnvironmentError`` is an alias of ``OSError``)."""


class InvariantError(RollforgeError, AssertionError):
    """A trajectory or message broke an internal invariant; this is a bug in rollforge."""


class CheckpointError(RollforgeError):
    """A training checkpoint is missing, incomplete or unreadable (``--resume`` names what it skipped)."""


def require(package: str, extra: str, feature: str):
    """Import an optional dependency or raise ``MissingDependency`` naming the extra."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependency(package, extra, feature) from exc
