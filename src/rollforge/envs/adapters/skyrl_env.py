"""SkyRL-Gym environments (``skyrl-gym``), run unchanged: one ``BaseTextEnv`` per episode.

Design: ``SkyRLEnvironment(env)`` opens a ``SkyRLSession`` per episode. ``env`` is a registered
id (``gsm8k_multi_turn``, or one the user registered with ``skyrl_gym.register``) or an entry
point ``module:Class`` naming a ``BaseTextEnv`` subclass; on the command line and in training
configs they read ``skyrl:gsm8k_multi_turn`` and ``skyrl:my_pkg.envs:MyEnv``.

``reset`` builds the environment exactly as SkyRL's generator does,
``skyrl_gym.make(id, env_config=..., extras=row)``, where the row is a SkyRL dataset row without
its ``prompt`` and ``env_class`` (so ``reward_spec``, ``extra_info`` and any other column reach the
environment), then calls ``init(prompt)`` with the prompt as OpenAI-style message dicts; the
conversation it returns is the episode's prompt. Each ``step`` hands the text of the assistant
message just generated to ``env.step(action)``: its ``observations`` become the messages appended,
its ``reward`` this turn's reward (per-turn rewards are kept, never summed away) and ``done``
terminates the episode (SkyRL has no ``truncated``: its own turn limits are the task's rules). The
last ``metadata`` is the session's ``metadata``.

Tokens stay exactly as sampled: a ``postprocessed_action`` (SkyRL's generator re-tokenizes the
output with it) cannot rewrite them, so it is kept in ``metadata`` (``postprocessed_action``) and
nothing else. SkyRL declares stop strings in its generator's sampling parameters, not on the
environments (none of the 0.4 environments declares any): the sample's stop strings apply.

A row whose ``env_class`` names another environment, or that the environment's constructor refuses
(SkyRL environments ``assert`` their required fields), fails its episode with one line naming the
environment and the reason. The registered ``gsm8k`` and ``gsm8k_multi_turn`` have generated
prompts in the shape of SkyRL's gsm8k dataset (``samples``); other ids need a data file.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Mapping
from typing import Any

from ...errors import ConfigError, EnvironmentError_, require
from ...types import Message, Sample
from ...workers import run_blocking
from ..base import BaseSession, Environment, Reset, Step
from . import unknown_item

EXTRA = "skyrl"
FAMILY = "skyrl"
#: SkyRL's gsm8k preprocessing appends this to each question.
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_GENERATED = ("gsm8k", "gsm8k_multi_turn")


def _skyrl() -> Any:
    return require("skyrl_gym", EXTRA, "the SkyRL-Gym environments")


def resolve(env: str) -> Any:
    """The ``skyrl_gym`` spec ``make`` takes for ``env`` (a registered id or ``module:Class``);
    a ``ConfigError`` naming ``env`` when it is neither."""
    skyrl_gym = _skyrl()
    from skyrl_gym.envs.registration import EnvSpec as SkyRLSpec
    from skyrl_gym.envs.registration import load_env_creator

    if env in skyrl_gym.registry:
        return skyrl_gym.registry[env]
    if ":" not in env:
        error = unknown_item("SkyRL-Gym environment", env, skyrl_gym.registry)
        raise ConfigError(f"{error}; a class of your own is named skyrl:module:Class") from None
    try:
        creator = load_env_creator(env)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"SkyRL-Gym entry point {env!r} does not load: {exc}") from None
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    if not (isinstance(creator, type) and issubclass(creator, BaseTextEnv)):
        raise ConfigError(f"SkyRL-Gym entry point {env!r} is {creator!r}; expected a BaseTextEnv subclass")
    return SkyRLSpec(id=env, entry_point=creator)


def check_env_id(env: str) -> None:
    resolve(env)


class SkyRLEnvironment(Environment):
    """Opens one SkyRL-Gym environment per episode (see the module docstring). ``env_config`` is
    what SkyRL reads from ``environment.skyrl_gym.<env_class>`` (e.g. a search server's URL)."""

    def __init__(self, env: str, env_config: Mapping[str, Any] | None = None):
        self.spec = resolve(env)
        from omegaconf import DictConfig

        self.env_config = DictConfig(dict(env_config or {}))

    def open(self, sample: Sample) -> SkyRLSession:
        return SkyRLSession(self.spec, self.env_config)


class SkyRLSession(BaseSession):
    def __init__(self, spec: Any, env_config: Any):
        self.spec, self.env_config = spec, env_config
        self._env: Any = None
        self._metadata: dict[str, Any] = {}

    @property
    def handle(self) -> Any:
        return self._env

    @property
    def metadata(self) -> Any:
        return self._metadata

    async def reset(self, sample: Sample) -> Reset:
        env_class = sample.row.get("env_class")
        if env_class is not None and ":" not in self.spec.id and env_class != self.spec.id:
            raise EnvironmentError_(
                f"row's env_class {env_class!r} is not this environment's ({self.spec.id!r}); "
                "route rows to environments with a task_name column"
            )
        extras = {k: v for k, v in sample.row.items() if k != "env_class"}
        prompt = [{"role": m.role, "content": m.content} for m in sample.prompt]
        opening = await run_blocking(self._init, extras, prompt)
        return Reset(prompt=_messages(opening, "init"))

    def _init(self, extras: dict[str, Any], prompt: list[dict[str, Any]]) -> Any:
        _skyrl()
        from skyrl_gym import make

        try:
            self._env = make(self.spec, env_config=self.env_config, extras=extras)
        except (AssertionError, KeyError, TypeError, ValueError) as exc:
            reason = str(exc) or type(exc).__name__
            raise EnvironmentError_(f"SkyRL-Gym environment {self.spec.id!r} refused the row: {reason}") from None
        opening, _ = self._env.init(prompt)
        return opening

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self._env is None:
            raise EnvironmentError_("step() was called before a successful reset()")
        last = conversation[-1] if conversation else None
        action = last.content if last is not None and last.role == "assistant" else ""
        out = await run_blocking(self._env.step, action)
        if not isinstance(out, Mapping):
            raise EnvironmentError_(
                f"{self.spec.id}.step returned {type(out).__name__}; expected a BaseTextEnvStepOutput dict"
            )
        self._metadata = dict(out.get("metadata") or {})
        if out.get("postprocessed_action") is not None:
            self._metadata["postprocessed_action"] = out["postprocessed_action"]
        reward = out.get("reward", 0.0)
        if isinstance(reward, numbers.Real) and not isinstance(reward, bool):
            reward = float(reward)  # SkyRL scorers return ints (0) and numpy numbers too
        return Step(
            messages=_messages(out.get("observations") or [], "step"), reward=reward, terminated=bool(out.get("done"))
        )

    async def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            await run_blocking(env.close)


def _messages(dicts: Any, where: str) -> tuple[Message, ...]:
    try:
        return tuple(Message(m["role"], m["content"]) for m in dicts)
    except (KeyError, TypeError) as exc:
        raise EnvironmentError_(
            f"SkyRL-Gym {where} must give {{role, content}} messages, got {dicts!r:.120} ({exc})"
        ) from None


def gsm8k_rows(env: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` generated rows in the shape of SkyRL's gsm8k dataset (``examples/gsm8k``)."""
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        apples, more, eaten = rng.randint(2, 20), rng.randint(2, 20), rng.randint(1, 5)
        question = f"Tom has {apples} apples, buys {more} more and eats {eaten}. How many apples does Tom have now?"
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
                "env_class": env,
                "reward_spec": {"method": "rule", "ground_truth": str(apples + more - eaten)},
                "extra_info": {"split": "train", "index": index},
            }
        )
    return rows


def samples(env: str, n: int, seed: int) -> list[Sample]:
    check_env_id(env)
    if env not in _GENERATED:
        raise ConfigError(
            f"skyrl:{env} has no prompt generator; give prompts with --data FILE.jsonl (SkyRL rows: "
            "prompt, env_class, reward_spec, extra_info)"
        )
    return [
        Sample(
            prompt=tuple(Message(**m) for m in row["prompt"]),
            task_name=f"{FAMILY}:{env}",
            row={k: v for k, v in row.items() if k != "prompt"},
        )
        for row in gsm8k_rows(env, n, seed)
    ]


def build(env: str) -> SkyRLEnvironment:
    return SkyRLEnvironment(env)
