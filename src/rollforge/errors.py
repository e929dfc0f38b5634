"""The rollforge exception tree: every exception class rollforge defines, named after the boundary
that failed, and ``require`` (an optional import that raises ``MissingDependency``)::

    RollforgeError
    ├── ConfigError (ValueError)     bad user input: options, environment names, task names, arguments
    │   └── ToolArgumentError        a tool call's arguments do not match the tool's signature
    ├── ModelError                   a model or tokenizer cannot be resolved or loaded
    ├── TemplateError                a chat template cannot be rendered incrementally
    ├── MissingDependency (ImportError)  an optional dependency is not installed (names the extra)
    ├── BackendError                 a generation backend failed a request
    │   └── ContextExceeded          a prompt longer than the model's positions (no retry can help)
    ├── EnvironmentError_            an environment raised, timed out or broke its contract
    │   ├── SandboxUnavailable       the kernel or privileges here cannot build the sandbox
    │   ├── ServerError              an OpenEnv server answered with an error frame
    │   ├── ConnectionLost           an OpenEnv server's socket closed or could not be opened
    │   └── ActorDied                the Ray actor holding an episode's environment died
    ├── EpisodeFailed                an episode ends with a recorded ``Failure`` (raised by ``boundary.boundary``)
    ├── RewardUnavailable            a reward service (an LLM judge) failed: the reward is unknown, never 0
    ├── InvariantError (AssertionError)  a trajectory broke an internal invariant: a rollforge bug
    ├── CheckpointError              a training checkpoint is missing, incomplete or unreadable
    ├── WireError                    a request the OpenAI-compatible gateway cannot serve (an HTTP status)
    ├── OtherSideFailed              a comparison benchmark's waiting trainer, when the other one failed
    └── SideFailed                   a comparison benchmark's side, run in a process of its own, failed
    ArgumentMismatch (Exception)     internal to tool-argument validation, collected into ToolArgumentError
    BadJSON (ValueError)             internal to tool-call parsing: model output that is not strict JSON

(The sandbox launcher, ``envs/sandbox/_launcher.py``, keeps its own ``SetupError``: it runs
standalone inside the jail, where rollforge is not importable, and reports setup errors as JSON.)

The boundaries that turn what crosses them into ``EpisodeFailed`` (and tell rollforge's own bugs
from the other side's failures) live one floor up, in ``boundary.py``; this module imports nothing
of rollforge's, so every other module can import it.
"""

from __future__ import annotations

from typing import Any, Sequence


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


class ContextExceeded(BackendError):
    """A request's prompt does not fit the model's positions (prompt plus one new token): a fault of
    the episode's inputs that no rerun repairs, recorded as ``context_exceeded`` (``endings.py``), a
    policy failure, never retried. Backends raise it instead of a plain ``BackendError``."""


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
    """Ends one episode with ``failure`` (a ``types.Failure``) recorded on its trajectory; the engine
    catches it."""

    def __init__(self, failure: Any):
        super().__init__(f"{failure.kind}: {failure.message}")
        self.failure = failure

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        """Pickled with its ``failure`` (an engine worker process sends it to the parent), so the
        kind survives the trip instead of arriving as a ``backend_error``."""
        return (type(self), (self.failure,))


class RewardUnavailable(RollforgeError):
    """A reward could not be computed for a reason outside the episode (a judge server timed out,
    answered an HTTP error or a reply that does not parse): the reward is unknown, an infrastructure
    failure (``reward_unavailable``), never 0. A reward function raises it for every episode of its
    call, or returns instances in its list for some (as ``asyncio.gather(return_exceptions=True)``)."""


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


class OtherSideFailed(RollforgeError):
    """Raised by the side of ``bench vs-trl`` that was waiting when the other one failed (the other's
    error is the one to show)."""


class SideFailed(RollforgeError):
    """A side of ``bench learning`` (a process of its own) failed: the message names the side and
    the child's one-line error, or the signal that killed it."""
