"""Evaluation: roll a policy out on prompts, ``n`` times each, and report mean reward and pass@k.

Greedy evaluation (the default) runs each prompt once. Sampled evaluation runs it ``n`` times and
reports the unbiased pass@k estimate of Chen et al. (2021) for every k <= n: with c of n samples
successful (reward >= ``success_threshold``), pass@k = 1 - C(n - c, k) / C(n, k), averaged
over prompts. An episode's reward is its environment's total reward plus the weighted
``Scoring.reward_functions``, applied as training applies them (``inputs/rewards.py``).

``evaluate`` opens the backend a ``BackendConfig`` describes (here, or on replicas:
``open_generation``), evaluates on it and closes it: the base model before the quickstart's warm-up,
``rollforge eval`` and the learning benchmark's held-out questions. A run that holds its backend open
(training's held-out evaluation) calls ``aevaluate`` on it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..backends.config import BackendConfig
from ..chat.render import ChatRenderer
from ..cluster.generation import open_generation
from ..envs.base import Environment
from ..errors import ConfigError
from ..rollout.checks import CheckedBatch
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..types import Sample, Trajectory
from .rewards import compute_rewards


@dataclass(frozen=True)
class EvalResult:
    episodes: int
    mean_reward: float
    pass_at_k: dict[int, float]
    per_task: dict[str, float]
    trajectories: tuple[Trajectory, ...] = field(repr=False, default=())
    #: Each episode's reward (its environment's plus the reward functions'), in order.
    rewards: tuple[float, ...] = field(repr=False, default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "episodes": self.episodes,
            "mean_reward": self.mean_reward,
            "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()},
            "per_task": self.per_task,
        }


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class Scoring:
    """How an evaluation samples and scores: ``samples_per_prompt`` episodes of each prompt (the n
    of pass@k; more than 1 needs sampling, not greedy decoding), the reward that counts as a pass,
    and the reward functions added to the environments' rewards."""

    samples_per_prompt: int = 1
    success_threshold: float = 1.0
    reward_functions: tuple[Any, ...] = ()


async def aevaluate(
    prompts: Sequence[Sample],
    task_to_env: Mapping[str, Environment],
    backend: Any,
    renderer: ChatRenderer,
    config: RolloutConfig,
    *,
    scoring: Scoring = Scoring(),
    workers: Any = None,
) -> EvalResult:
    """``scoring``: see ``Scoring``; ``workers``: an open ``EngineWorkers`` pool to run the episodes
    on (``arollout``)."""
    n = scoring.samples_per_prompt
    if n < 1:
        raise ConfigError(f"samples_per_prompt must be >= 1, got {n}")
    if config.greedy and n > 1:
        raise ConfigError(f"greedy evaluation gives the same answer every time; use samples_per_prompt=1, not {n}")
    samples: Sequence[Sample] = [s for s in prompts for _ in range(n)]
    if isinstance(prompts, CheckedBatch):  # checked once by the run: its evaluations do not check again
        samples = prompts.prompts.batch(samples)
    result = await arollout(samples, task_to_env, backend, renderer, config, workers=workers)
    trajectories = result.trajectories
    rewards = (await compute_rewards(trajectories, samples, scoring.reward_functions)).totals
    passes: dict[int, float] = {}
    for k in range(1, n + 1):
        passes[k] = statistics.fmean(
            pass_at_k(n, sum(r >= scoring.success_threshold for r in rewards[i : i + n]), k)
            for i in range(0, len(rewards), n)
        )
    tasks = sorted({t.task_name for t in trajectories})
    per_task = {
        task: statistics.fmean(r for t, r in zip(trajectories, rewards) if t.task_name == task) for task in tasks
    }
    return EvalResult(len(trajectories), statistics.fmean(rewards), passes, per_task, trajectories, tuple(rewards))


async def evaluate(
    generation: BackendConfig,
    prompts: Sequence[Sample],
    task_to_env: Mapping[str, Environment],
    renderer: ChatRenderer,
    config: RolloutConfig,
    *,
    hf_model: Any = None,
    scoring: Scoring = Scoring(),
) -> EvalResult:
    """``aevaluate`` on the backend ``generation`` describes, opened for it (on ``hf_model``, a loaded
    model, when given; the renderer's tokenizer) and closed after."""
    async with open_generation(generation, hf_model=hf_model, tokenizer=renderer.tokenizer) as backend:
        return await aevaluate(prompts, task_to_env, backend, renderer, config, scoring=scoring)
