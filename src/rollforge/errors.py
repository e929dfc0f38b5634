"""The rollforge exception tree, and the boundaries that turn what crosses them into failures.

Every exception class rollforge defines lives here, named after the boundary that failed::

    RollforgeError
    ├── ConfigError (ValueError)     bad user input: options, environment names, task names, arguments
    │   └── ToolArgumentError        a tool call's arguments do not match the tool's signature
    ├── ModelError                   a model or tokenizer cannot be resolved or loaded
    ├── TemplateError                a chat template cannot be rendered incrementally
    ├── MissingDependency (ImportError)  an optional dependency is not installed (names the extra)
    ├── BackendError                 a generation backend failed a request
    ├── EnvironmentError_            an environment raised, timed out or broke its contract
    │   ├── SandboxUnavailable       the kernel or privileges here cannot build the sandbox
    │   ├── ServerError              an OpenEnv server answered with an error frame
    │   ├── ConnectionLost           an OpenEnv server's socket closed or could not be opened
    │   └── ActorDied                the Ray actor holding an episode's environment died
    ├── EpisodeFailed                an episode ends with a recorded ``Failure`` (raised by ``boundary``)
    ├── InvariantError (AssertionError)  a trajectory broke an internal invariant: a rollforge bug
    ├── CheckpointError              a training checkpoint is missing, incomplete or unreadable
    └── WireError                    a request the OpenAI-compatible gateway cannot serve (an HTTP status)
    ArgumentMismatch (Exception)     internal to tool-argument validation, collected into ToolArgumentError
    BadJSON (ValueError)             internal to tool-call parsing: model output that is not strict JSON

(The sandbox launcher, ``envs/sandbox/_launcher.py``, keeps its own ``SetupError``: it runs
standalone inside the jail, where rollforge is not importable, and reports setup errors as JSON.)

Boundaries. Errors inside an episode never propagate out of the engine: ``boundary(kind, what)``
wraps each call across a boundary — ``backend`` (generation), ``environment`` (reset, step,
reward, close), ``tool`` and ``reward`` (reward functions) — and turns what the other side raised
into ``EpisodeFailed`` carrying a ``Failure`` of that boundary's kind. rollforge's own bugs are not
the other side's failures and propagate instead (``is_own_bug``): an exception of a bug's type
(``InvariantError`` and other ``AssertionError``s, ``TypeError``, ``AttributeError``, ``NameError``,
``KeyError``, ``IndexError``) that never passed through code outside rollforge. Classification is
by the traceback below the frame that caught it: one frame of the user's code (anything outside
rollforge and the standard library: the user's files, installed packages) makes it the other side's
failure, so a user's environment raising ``TypeError``, or building an invalid ``Message``, is
``env_error``. Calling the user's function with arguments its signature refuses is the user's too:
user code is called through ``call_user``, and a ``TypeError`` raised in that frame is the user's.
"""

from __future__ import annotations

import contextlib
import os
import sysconfig
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

if TYPE_CHECKING:
    from .types import Failure


class RollforgeError(Exception):
    """Root of every error rollforge raises on purpose."""


class ConfigError(RollforgeError, ValueError):
    """Bad user input: the message names the bad value and what was expected."""


class ToolArgumentError(ConfigError):
    """The arguments of a tool call do not match the tool's signature. ``problems`` lists every
    mismatch found, each naming the argument, what was expected and what was given."""

    def __init__(self, tool: str, problems: Sequence[str]):
        self.tool = tool
        self.problems = tuple(problems)
        super().__init__(f"invalid arguments for tool {tool}: " + "; ".join(self.problems))


class ArgumentMismatch(Exception):
    """Raised by a type spec when a value does not fit; ``tools.validate_arguments`` collects them."""


class BadJSON(ValueError):
    """Model output that is not strict JSON; the message says why and where (internal to the
    tool-call parsers, which turn it into an error call)."""


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


class SandboxUnavailable(EnvironmentError_):
    """The kernel or the privileges here do not allow building the jail (see ``sandbox_support``)."""


class ServerError(EnvironmentError_):
    """An OpenEnv server answered a request with an error frame; ``code`` is its error code."""

    def __init__(self, code: str, message: str, data: dict[str, Any]):
        self.code = code
        self.data = data
        super().__init__(f"{code}: {message}")


class ConnectionLost(EnvironmentError_):
    """An OpenEnv server's socket closed or could not be opened (server gone, restarted, network)."""


class ActorDied(EnvironmentError_):
    """The environment actor holding this episode died."""


class EpisodeFailed(RollforgeError):
    """Ends one episode with ``failure`` recorded on its trajectory; the engine catches it."""

    def __init__(self, failure: "Failure"):
        super().__init__(f"{failure.kind}: {failure.message}")
        self.failure = failure


class InvariantError(RollforgeError, AssertionError):
    """A trajectory or message broke an internal invariant; this is a bug in rollforge."""


class CheckpointError(RollforgeError):
    """A training checkpoint is missing, incomplete or unreadable (``--resume`` names what it skipped)."""


class WireError(RollforgeError):
    """A request the gateway cannot serve; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    def body(self) -> dict:
        """The error in OpenAI's response shape."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def require(package: str, extra: str, feature: str):
    """Import an optional dependency or raise ``MissingDependency`` naming the extra."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise MissingDependency(package, extra, feature) from exc


# -- boundaries ------------------------------------------------------------------------------------

#: The failure kind each boundary files what crosses it under.
BOUNDARY_KINDS = {"backend": "backend_error", "environment": "env_error", "tool": "tool_raised", "reward": "reward_error"}

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
        from .types import Failure

        reason = f"{type(exc).__name__}: {exc}"
        raise EpisodeFailed(Failure(BOUNDARY_KINDS[kind], f"{what} raised {reason}" if what else reason)) from exc
