"""textarena single-player games as multi-turn environments (one game object per episode).

Design: ``TextArenaEnvironment(env_id)`` opens a ``TextArenaSession`` per episode. ``reset`` makes
the game with ``textarena.make(env_id)``, resets it with the sample's ``seed`` (row column) and
appends the game's opening text to the last user message. Each ``step`` sends the last assistant
message to the game as the action and returns what the game said since (its messages, one per
line) as a user observation. Like textarena's default ``ActionFormattingWrapper``, a reply without
any square bracket is wrapped in brackets ("5" becomes "[5]"); replies with brackets go as they
are, so the model may think aloud around its ``[move]``.

When the game ends, the step terminates with the game's reward for player 0 (textarena's
single-player games score in [0, 1]: 1 for a win, the fraction completed otherwise) and the game's
closing reason as the observation (textarena has no ``truncated``: a game's turn limit is one of
its rules, and the game ends as a loss or a draw). The default wrappers are not used: the raw game reports only
new messages, which is what a chat turn needs (the LLM observation wrapper repeats the history).

textarena seeds Python's global ``random`` on reset, so every call into a game holds one lock:
concurrent episodes of the same seed stay deterministic. The calls are short (a board update).
Games that need NLTK data (Wordle and other word games download it on first use, which needs the
network) are made once when the environment is built: data that is missing is then one line naming
the resource and the command that installs it, before any episode (``_make``). The
bundled names are games that run offline.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import random
import re
import threading
from dataclasses import replace
from typing import Any, Iterator

from ...errors import ConfigError, EnvironmentError_, require
from ...types import Message, Sample
from ...workers import run_blocking
from ..base import BaseSession, Environment, Reset, Step
from . import unknown_item

EXTRA = "textarena"
FAMILY = "textarena"
_GAME_LOCK = threading.Lock()

SYSTEM_PROMPT = (
    "You are playing a text game. Read the game's messages and reply with your move in the format "
    "the game asks for, in square brackets (for example [5]). One move per reply."
)


def _ta() -> Any:
    return require("textarena", EXTRA, "the textarena environments")


def check_game(env_id: str) -> None:
    _ta()  # first: a missing library is the one line naming its extra, not textarena's ImportError
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        raise unknown_item("textarena game", env_id, ENV_REGISTRY)


@contextlib.contextmanager
def _quiet_nltk_downloads() -> Iterator[None]:
    """Word games call ``nltk.download`` when their module is first imported; offline, each failed
    download prints lines to the stderr NLTK saw at import (no redirect reaches it): sent nowhere,
    since ``_make`` reports the missing resource in one line."""
    if importlib.util.find_spec("nltk") is None:
        yield
        return
    import nltk

    download = nltk.download
    nltk.download = functools.partial(download, print_error_to=io.StringIO())
    try:
        yield
    finally:
        nltk.download = download


def _make(env_id: str, missing_data: type[Exception]) -> Any:
    """A raw game (hold ``_GAME_LOCK``); NLTK data the game needs and does not find is one line of
    ``missing_data`` (a ``ConfigError`` at start-up, an ``EnvironmentError_`` in an episode)."""
    try:
        return _unwrap(_ta().make(env_id))
    except LookupError as exc:  # NLTK's resource lookup: a 25-line banner in the message
        found = re.search(r"Attempted to load '([^']+)'", str(exc))
        if found is None:
            raise
        resource = found.group(1).strip("/").split("/")[-1]  # corpora/words -> words
        raise missing_data(
            f"textarena game {env_id!r} needs NLTK's {resource!r} data, which is not installed (NLTK "
            f"downloads it on first use, which needs the network): run python -m nltk.downloader {resource}"
        ) from None


def _unwrap(env: Any) -> Any:
    while hasattr(env, "env"):
        env = env.env
    return env


def _render(messages: Any) -> str:
    """A raw game's observation list ``[(sender, text, type), ...]`` minus the player's echo."""
    lines = []
    for sender, text, *_ in messages or ():
        if sender != 0:  # player 0's own action, echoed back
            lines.append(str(text).strip())
    return "\n".join(line for line in lines if line)


class TextArenaEnvironment(Environment):
    """Opens one game per episode (see the module docstring)."""

    max_sessions: int | None = None

    def __init__(self, env_id: str):
        check_game(env_id)
        with _GAME_LOCK, _quiet_nltk_downloads():
            _make(env_id, ConfigError)
        self.env_id = env_id

    def open(self, sample: Sample) -> TextArenaSession:
        return TextArenaSession(self.env_id)


class TextArenaSession(BaseSession):
    def __init__(self, env_id: str):
        self.env_id = env_id
        self._game: Any = None
        self._done = False

    @property
    def handle(self) -> Any:
        return self._game

    async def reset(self, sample: Sample) -> Reset:
        seed = sample.row.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"textarena samples need an int 'seed' column, got {seed!r}")
        opening = await run_blocking(self._reset, seed)
        last = sample.prompt[-1]
        if last.role != "user":
            raise ConfigError(f"a textarena prompt must end with a user message, not {last.role}")
        return Reset(prompt=(*sample.prompt[:-1], replace(last, content=f"{last.content}\n\n{opening}")))

    def _reset(self, seed: int) -> str:
        with _GAME_LOCK:
            self._game = _make(self.env_id, EnvironmentError_)
            self._game.reset(num_players=1, seed=seed)
            _, messages = self._game.get_observation()
        return _render(messages)

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self._game is None:
            raise EnvironmentError_("step() was called before a successful reset()")
        if self._done:
            return Step(terminated=True)
        reply = conversation[-1].content if conversation and conversation[-1].role == "assistant" else ""
        action = reply if ("[" in reply or "]" in reply) else f"[{reply.strip()}]"
        text, done, reward = await run_blocking(self._step, action)
        self._done = done
        return Step(messages=(Message("user", text or "(no reply from the game)"),), reward=reward, terminated=done)

    def _step(self, action: str) -> tuple[str, bool, float]:
        with _GAME_LOCK:
            done, _ = self._game.step(action)
            _, messages = self._game.get_observation()
            text = _render(messages)
            if not done:
                return text, False, 0.0
            rewards, info = self._game.close()
        reward = float((rewards or {}).get(0, 0.0))
        reason = ((info or {}).get(0) or {}).get("reason")
        return (
            "\n".join(part for part in (text, f"Game over: {reason}" if reason else "Game over.") if part),
            True,
            reward,
        )


def samples(env_id: str, n: int, seed: int) -> list[Sample]:
    check_game(env_id)
    rng = random.Random(seed)
    name = env_id.split("-")[0]
    prompt = (Message("system", SYSTEM_PROMPT), Message("user", f"Let's play {name}."))
    return [Sample(prompt=prompt, task_name=f"{FAMILY}:{env_id}", row={"seed": rng.randrange(2**31)}) for _ in range(n)]


def build(env_id: str) -> TextArenaEnvironment:
    return TextArenaEnvironment(env_id)
