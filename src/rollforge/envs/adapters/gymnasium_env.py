"""Gymnasium environments with text renderings as tool environments (``environment_factory`` style).

Design: one gymnasium env per episode, made in ``reset(seed)`` with ``render_mode="ansi"``; every
tool call is one ``env.step`` and returns the new rendering. The episode ends when gymnasium says
``terminated`` or ``truncated`` (its ``TimeLimit``), and the trajectory says which: ``done`` and
``truncated`` are the attributes ``environment_factory`` classes end an episode with. The reward is
the sum of gymnasium's rewards.
Two classes share that core:

- ``FrozenLakeEnv``: FrozenLake-v1 on a 4x4 map generated from the seed (``generate_random_map``),
  not slippery, at most ``FROZENLAKE_STEPS`` moves; the tool ``move(direction)`` takes
  ``left|down|right|up`` and the board is drawn with ``P`` where the player stands (gymnasium's
  ANSI highlight carries no text);
- ``GymnasiumTextEnv(env_id)``: any gymnasium env with a ``Discrete`` action space and an ``ansi``
  render mode, driven by ``act(action: int)``; ANSI colour codes are stripped from the rendering.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any, Literal

from ...errors import ConfigError, require
from ...types import Message, Sample
from . import unknown_item
from ..base import Environment

EXTRA = "gymnasium"
FAMILY = "gymnasium"
FROZENLAKE_STEPS = 16
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

FROZENLAKE_PROMPT = (
    "You are on a frozen lake (a 4x4 grid). Reach the goal G without falling into a hole H; "
    "F is safe ice, S the start, P is you. Call move with left, down, right or up, one step per call."
)


def _gym() -> Any:
    return require("gymnasium", EXTRA, "the gymnasium environments")


class _GymText:
    """The shared core: one gymnasium env per episode, one ``step`` per tool call."""

    def __init__(self) -> None:
        self._env: Any = None
        self.total = 0.0
        self.done = False
        self.truncated = False  # done by a limit (gymnasium's truncated), not in an end state

    def _make(self, seed: int) -> Any:
        raise NotImplementedError

    def _render(self) -> str:
        return _ANSI.sub("", str(self._env.render())).strip("\n")

    def reset(self, seed: int, **_: object) -> str:
        if self._env is not None:
            self._env.close()
        self._env = self._make(seed)
        self._env.reset(seed=seed)
        self.total, self.done, self.truncated = 0.0, False, False
        return self._render()

    def _apply(self, action: int) -> str:
        if self.done:
            return "The episode is over."
        _, reward, terminated, truncated, _ = self._env.step(action)
        self.total += float(reward)
        self.done = bool(terminated or truncated)
        self.truncated = bool(truncated and not terminated)  # Gymnasium: terminated wins
        text = self._render()
        if self.done:
            ending = "out of steps" if self.truncated else "episode over"
            text += f"\n{ending}: total reward {self.total:g}."
        return text

    def get_reward(self) -> float:
        return self.total

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class FrozenLakeEnv(_GymText):
    """FrozenLake-v1, 4x4, not slippery (see the module docstring)."""

    _ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}

    def _make(self, seed: int) -> Any:
        gym = _gym()
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        desc = generate_random_map(size=4, seed=seed)
        return gym.make(
            "FrozenLake-v1", desc=desc, is_slippery=False, render_mode="ansi", max_episode_steps=FROZENLAKE_STEPS
        )

    def _render(self) -> str:
        lake = self._env.unwrapped
        rows = [[cell.decode() for cell in row] for row in lake.desc]
        row, col = divmod(int(lake.s), lake.ncol)
        rows[row][col] = "P"
        return "\n".join(" ".join(cells) for cells in rows)

    def move(self, direction: Literal["left", "down", "right", "up"]) -> str:
        """Move one square on the lake.

        Args:
            direction: Where to move: left, down, right or up.
        """
        text = self._apply(self._ACTIONS[direction])
        if self.done and self.total > 0:
            text += "\nYou reached the goal!"
        return text


class GymnasiumTextEnv(_GymText):
    """Any Discrete-action gymnasium env with an ANSI rendering, driven by action indices."""

    def __init__(self, env_id: str) -> None:
        super().__init__()
        self.env_id = env_id

    def _make(self, seed: int) -> Any:
        return _gym().make(self.env_id, render_mode="ansi")

    def act(self, action: int) -> str:
        """Take one action in the environment.

        Args:
            action: The index of the action, from 0 to the number of actions minus one.
        """
        count = self._env.action_space.n
        if not 0 <= action < count:
            raise ValueError(f"action must be between 0 and {count - 1}, got {action}")
        return self._apply(action)


def check_env_id(env_id: str) -> int:
    """The number of actions of ``env_id``; a ``ConfigError`` unless it is Discrete with ANSI renders."""
    gym = _gym()
    if env_id not in gym.registry:
        raise unknown_item("gymnasium environment", env_id, gym.registry)
    env = gym.make(env_id)
    try:
        modes = env.metadata.get("render_modes", [])
        if "ansi" not in modes:
            raise ConfigError(
                f"gymnasium environment {env_id!r} has no text rendering (render modes: {modes}); rollforge "
                "plays environments that render as text (render mode 'ansi'), e.g. FrozenLake-v1, CliffWalking-v1"
            )
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ConfigError(f"gymnasium environment {env_id!r} needs a Discrete action space, not {env.action_space}")
        return int(env.action_space.n)
    finally:
        env.close()


def build_frozenlake() -> Environment:
    _gym()
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(FrozenLakeEnv)


def samples_frozenlake(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    prompt = (Message("system", "You are a helpful assistant. You can call tools."), Message("user", FROZENLAKE_PROMPT))
    return [Sample(prompt=prompt, task_name="frozenlake", row={"seed": rng.randrange(2**31)}) for _ in range(n)]


def build(env_id: str) -> Environment:
    from ..factory import FactoryEnvironment

    check_env_id(env_id)
    return FactoryEnvironment(functools.partial(GymnasiumTextEnv, env_id))


def samples(env_id: str, n: int, seed: int) -> list[Sample]:
    actions = check_env_id(env_id)
    rng = random.Random(seed)
    text = (
        f"You are playing the gymnasium environment {env_id}. Call act with an action index from 0 to "
        f"{actions - 1}, one action per call, to collect as much reward as you can."
    )
    prompt = (Message("system", "You are a helpful assistant. You can call tools."), Message("user", text))
    return [Sample(prompt=prompt, task_name=f"{FAMILY}:{env_id}", row={"seed": rng.randrange(2**31)}) for _ in range(n)]
