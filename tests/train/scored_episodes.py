"""One-turn trajectories with a given reward for the sampler and step-metric tests: two tokens (a
prompt token and one policy token at logprob -0.5), ended normally, or failed with ``error`` (a
failure kind) as an ``error`` ending."""

from __future__ import annotations

from rollforge.types import Failure, Message, Trajectory


def episode(index: int, reward: float, error: str | None = None, retries: int = 0) -> Trajectory:
    return Trajectory(
        index=index,
        task_name="t",
        messages=(Message("user", "q"),),
        token_ids=(1, 2),
        loss_mask=(0, 1),
        logprobs=(None, -0.5),
        prompt_length=1,
        rewards=(reward,),
        total_reward=reward,
        turns=1,
        ending="error" if error else "terminated",
        error=Failure(error, "x") if error else None,
        retries=retries,
    )
