"""Boundaries: what crosses them becomes a recorded failure, rollforge's own bugs propagate.

Errors inside an episode never propagate out of the engine: ``boundary(kind, what)`` wraps each
call across a boundary — ``backend`` (generation), ``environment`` (reset, step, reward, close),
``tool`` and ``reward`` (reward functions) — and turns what the other side raised into
``EpisodeFailed`` carrying a ``Failure`` of that boundary's kind. rollforge's own bugs are not the
other side's failures and propagate instead (``is_own_bug``): an exception of a bug's type
(``InvariantError`` and other ``AssertionError``s, ``TypeError``, ``AttributeError``, ``NameError``,
``KeyError``, ``IndexError``) that never passed through code outside rollforge. Classification is
by the traceback below the frame that caught it: one frame of the user's code (anything outside
rollforge and the standard library: the user's files, installed packages) makes it the other side's
failure, so a user's environment raising ``TypeError``, or building an invalid ``Message``, is
``env_error``. Calling the user's function with arguments its signature refuses is the user's too:
user code is called through ``call_user``, and a ``TypeError`` raised in that frame is the user's.

One floor above ``errors.py`` (the exception classes) and ``types.py`` (``Failure``), below every
part that crosses a boundary.
"""

from __future__ import annotations

import contextlib
import os
import sysconfig
from typing import Any, Callable, Iterator

from .errors import EpisodeFailed, InvariantError, RollforgeError
from .types import Failure

#: The failure kind each boundary files what crosses it under.
BOUNDARY_KINDS = {
    "backend": "backend_error",
    "environment": "env_error",
    "tool": "tool_raised",
    "reward": "reward_error",
}

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_INSTALLED = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("purelib", "platlib")})
_STDLIB = tuple({os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")})
_BUG_TYPES = (AssertionError, TypeError, AttributeError, NameError, KeyError, IndexError)


def call_user(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call user code. A ``TypeError`` raised in this frame (the arguments do not fit the user's
    signature) is the user's, not a rollforge bug (see ``is_own_bug``)."""
    return function(*args, **kwargs)


def is_own_bug(exc: BaseException) -> bool:
    """Whether ``exc``, caught by rollforge, is a bug in rollforge rather than a failure of the code
    it called (see the module docstring)."""
    if not isinstance(exc, _BUG_TYPES) or (isinstance(exc, RollforgeError) and not isinstance(exc, InvariantError)):
        return False
    tb = exc.__traceback__
    codes = []
    while tb is not None:
        codes.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    if codes and codes[0] is boundary.__wrapped__.__code__:  # thrown into boundary() by its with-statement
        codes = codes[1:]
    below = codes[1:]  # the first frame is the one that caught it
    if not below:
        return isinstance(exc, InvariantError)
    if below[-1] is call_user.__code__:  # the user's signature refused the arguments
        return False
    return not any(_foreign(code.co_filename) for code in below)


def _foreign(filename: str) -> bool:
    """Code that is neither rollforge's nor the standard library's: the user's, or a package's."""
    if filename.startswith(_PACKAGE_DIR):
        return False
    if filename.startswith(_INSTALLED) or "site-packages" in filename or "dist-packages" in filename:
        return True
    return not (filename.startswith(_STDLIB) or filename.startswith("<"))  # <string>: generated __init__s


@contextlib.contextmanager
def boundary(kind: str, what: str | None) -> Iterator[None]:
    """Turn what the other side of a boundary raises into ``EpisodeFailed`` with a ``Failure`` of
    the boundary's kind (``BOUNDARY_KINDS``) and the message ``"{what} raised {Type}: {text}"``
    (``"{Type}: {text}"`` when ``what`` is None).
    Already-classified failures, rollforge's own bugs (``is_own_bug``) and cancellation pass through."""
    try:
        yield
    except EpisodeFailed:
        raise
    except Exception as exc:
        if is_own_bug(exc):
            raise
        reason = f"{type(exc).__name__}: {exc}"
        raise EpisodeFailed(Failure(BOUNDARY_KINDS[kind], f"{what} raised {reason}" if what else reason)) from exc
