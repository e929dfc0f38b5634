"""The environment contract the rollout engine sees: one ``EnvSession`` per running episode.

Users write environments in one of the familiar styles, and an adapter turns each into this
contract:

- environment classes in the ``environment_factory`` style (``envs/factory.py``): ``reset(**row)``,
  public methods as tools, optional ``get_reward()`` and ``done``;
- step-style batched environments routed by ``task_name`` (``envs/stepwise.py``).

The contract, per episode::

    session = environment.open(sample)
    reset = await session.reset(sample)            # -> Reset: opening conversation, tools, stop strings
    step = await session.step(conversation)        # after each assistant message -> Step
    ...
    bonus = await session.finish()                 # once, when the episode ends without error
    await session.close()                          # always, exactly once

An environment that generates by itself (an agent program behind the gateway) declares
``run_episode`` instead (``GeneratingEnvironment``).

``conversation`` is the whole conversation so far; its last message is the assistant message just
generated, whose ``tool_calls`` the engine has already parsed (unparseable calls carry ``error``).
Environments know nothing of tokens. Sync user code runs on rollforge's worker threads
(``workers.py``) so that a slow or hung environment never blocks other episodes; the engine bounds
every call with a timeout. A reward that is not a finite number is the environment's error.

``Environment`` is a base class: everything the engine may ask of an environment is declared on it
with a default (``max_sessions``, ``produces_images``, ``prepare``, ``release``); only ``open`` must
be written. The engine refuses an object that does not subclass it.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping, Protocol, runtime_checkable

from ..errors import ConfigError, EnvironmentError_
from ..placement import Placement
from ..types import Failure, Message, Sample, Trajectory


@dataclass(frozen=True)
class Reset:
    """The start of an episode.

    ``prompt`` is the opening conversation to render (the sample's prompt, possibly with the text
    ``reset`` returned appended to the last user message). ``tools`` are the JSON schemas of the
    tools offered, in the OpenAI function format (``{"type": "function", "function": {...}}``).
    ``stop`` replaces the sample's first-turn stop strings when not None. Schemas may be shared
    between episodes of one environment class: read them, do not mutate them.
    """

    prompt: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    stop: tuple[str, ...] | None = None


def append_to_last_user(prompt: tuple[Message, ...], text: str, images: tuple[Any, ...] = ()) -> tuple[Message, ...]:
    """``prompt`` with what ``reset`` returned (``text``, ``images``) appended to its last user
    message (after a blank line), or as a new user message when the last one is not the user's."""
    last = prompt[-1]
    if last.role != "user":
        return (*prompt, Message("user", text, images=images))
    content = f"{last.content}\n\n{text}" if last.content and text else (last.content or text)
    return (*prompt[:-1], replace(last, content=content, images=last.images + images))


@dataclass(frozen=True)
class Step:
    """The environment's answer to one assistant message.

    ``messages`` are appended to the conversation (tool results, an observation); they may be empty.
    ``reward`` is this turn's reward. Either flag ends the episode, as in Gymnasium:
    ``terminated`` when the task reached an end state (solved, failed, the game is over);
    ``truncated`` when a limit outside the task cut it off (the environment's own time or step
    limit), so the state it stopped in is not an end state. The trajectory records which
    (``terminated`` wins when both are set). ``stop`` sets the stop strings of the next turn (None
    keeps the current ones). ``failures`` are counted, non-fatal failures of this turn (bad tool
    calls), already reported to the model in ``messages``.
    """

    messages: tuple[Message, ...] = ()
    reward: float = 0.0
    terminated: bool = False
    stop: tuple[str, ...] | None = None
    failures: tuple[Failure, ...] = ()
    truncated: bool = False

    def __post_init__(self) -> None:
        reward = self.reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EnvironmentError_(f"Step.reward must be a finite number, got {type(reward).__name__} {reward!r}")

    @property
    def ending(self) -> Literal["terminated", "truncated"] | None:
        """How this step ends the episode (``terminated`` before ``truncated``), None when it goes on."""
        return "terminated" if self.terminated else "truncated" if self.truncated else None


def is_session_limit(value: Any) -> bool:
    """Whether ``value`` is a valid ``max_sessions``: None (no limit) or a positive int."""
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)


def check_max_sessions(value: Any) -> int | None:
    """``value`` when it is a valid ``max_sessions`` (``is_session_limit``), else a ``ConfigError``."""
    if not is_session_limit(value):
        raise ConfigError(f"max_sessions must be a positive int or None, got {value!r}")
    return value


@runtime_checkable
class EnvSession(Protocol):
    """One running episode's environment."""

    async def reset(self, sample: Sample) -> Reset: ...

    async def step(self, conversation: tuple[Message, ...]) -> Step: ...

    async def finish(self) -> float:
        """A final reward added to the last turn (``get_reward()`` of environment classes)."""
        ...

    async def close(self) -> None: ...

    @property
    def metadata(self) -> Any:
        """The per-sample environment info after the last step (step-style environments)."""
        ...

    @property
    def handle(self) -> Any:
        """The user's environment object, handed to reward functions as ``environments``."""
        ...


class Environment(abc.ABC):
    """Opens one session per episode. Subclasses write ``open``; the rest has defaults."""

    #: How many sessions may run at once (None: no limit); checked against the concurrency at start-up.
    max_sessions: int | None = None
    #: Whether sessions may return images; then the engine requires a backend that accepts them.
    produces_images: bool = False

    @abc.abstractmethod
    def open(self, sample: Sample) -> EnvSession:
        """A new session for ``sample`` (cheap: real work belongs in ``reset``)."""

    def offered_tools(self, sample: Sample) -> tuple[Mapping[str, Any], ...] | None:
        """The tool schemas an episode of ``sample`` will offer (``Reset.tools``) when they are
        known without opening one, else None. The engine measures prompts with them at start-up,
        as the chat template will render them."""
        return None

    async def prepare(self, sessions: int) -> None:
        """Called once before a rollout that may run ``sessions`` sessions at once: connect, read
        schemas, check a server's capacity (raise ``ConfigError`` when it does not fit)."""
        return None

    async def release(self) -> None:
        """Called once after the rollout whose ``prepare`` succeeded."""
        return None


class GeneratingEnvironment(Environment):
    """An environment that runs its episodes itself, generation included: an agent program that
    talks to rollforge's OpenAI-compatible gateway (``gateway/agent.py``). The engine hands each of
    its episodes to ``run_episode`` with the episode's context (``rollout.context.EpisodeContext``:
    backend, renderer, tool-call parser, rollout config) instead of running its turn loop; lockstep
    barriers do not hold it. The trajectory follows the engine's rules: mask 1 exactly on generated
    tokens, limits from the rollout config, a failure recorded on it and never raised."""

    def open(self, sample: Sample) -> EnvSession:
        raise ConfigError(
            f"{type(self).__name__} runs its own episodes (run_episode); it cannot be stepped as a "
            "session (nor run on a Ray environment pool)"
        )

    @abc.abstractmethod
    async def run_episode(self, index: int, sample: Sample, context: Any) -> Trajectory:
        """The episode's trajectory; failures are recorded on it, never raised."""


class BaseSession:
    """Defaults for the optional parts of ``EnvSession``."""

    async def finish(self) -> float:
        return 0.0

    async def close(self) -> None:
        return None

    @property
    def metadata(self) -> Any:
        return None

    @property
    def handle(self) -> Any:
        return None

    @property
    def placement(self) -> Placement | None:
        """The Ray actor that holds this session, with its node (``cluster/env_pool.py``); None
        when it runs in this process. The engine writes it on the trajectory (``served_by``); a
        session that does not subclass ``BaseSession`` runs here and reports nothing."""
        return None
