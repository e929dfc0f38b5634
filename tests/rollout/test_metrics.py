"""Rollout metrics: SPEC names, hand-computed values, missing (None) instead of NaN."""

from rollforge.rollout.metrics import rollout_metrics
from rollforge.types import Failure, Message, Trajectory


def trajectory(index, task, rewards, ids, mask, ending, failures=(), error=None):
    logprobs = tuple(-0.5 if bit else None for bit in mask)
    return Trajectory(
        index=index,
        task_name=task,
        messages=(Message("user", "q"),),
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=2,
        rewards=rewards,
        total_reward=sum(rewards),
        turns=len(rewards),
        ending=ending,
        error=error,
        failures=failures,
    )


def test_metrics_by_hand():
    ts = [
        trajectory(0, "a", (1.0,), (1, 2, 3, 4), (0, 0, 1, 1), "terminated"),
        trajectory(
            1,
            "a",
            (0.0, 0.5),
            (1, 2, 3, 4, 5, 6),
            (0, 0, 1, 0, 0, 1),
            "max_turns_reached",
            failures=(Failure("tool_unknown", "x"), Failure("tool_unknown", "y")),
        ),
        trajectory(2, "b", (0.0, 0.0, 0.0), (1, 2, 3), (0, 0, 1), "truncated"),
        trajectory(3, "b", (), (1, 2), (0, 0), "error", error=Failure("env_timeout", "slow")),
    ]
    m = rollout_metrics(ts, wall_seconds=2.0)
    assert m["total_turns"] == 6 and m["avg_turns_per_sample"] == 1.5 and m["max_turns_per_sample"] == 3
    assert m["natural_termination_rate"] == m["truncation_rate"] == m["max_turns_reached_rate"] == 0.25
    assert m["error_rate"] == 0.25 and m["errors"] == {"env_timeout": 1} and m["failures"] == {"tool_unknown": 2}
    assert m["mean_total_tokens_per_sample"] == (4 + 6 + 3 + 2) / 4
    assert m["mean_gen_tokens_per_sample"] == (2 + 2 + 1 + 0) / 4
    assert m["mean_env_tokens_per_sample"] == (0 + 2 + 0 + 0) / 4  # tokens after the prompt, not generated
    # the env_timeout episode's reward is unknown (an infrastructure failure): left out, as training does
    assert m["rewarded_episodes"] == 3 and m["infra_failures"] == 1
    assert m["mean_total_reward"] == 1.5 / 3 and m["max_total_reward"] == 1.0 and m["min_total_reward"] == 0.0
    assert m["generated_tokens_per_second"] == 5 / 2.0
    assert m["per_task"]["a"]["mean_total_reward"] == 0.75 and m["per_task"]["b"]["error_rate"] == 0.5
    assert m["per_task"]["b"]["mean_total_reward"] == 0.0 and m["per_task"]["b"]["rewarded_episodes"] == 1


def test_failed_episodes_are_left_out_of_rewards_not_counted_as_zero():
    failed = [
        trajectory(i, "a", (), (1, 2), (0, 0), "error", error=Failure(kind, "x"))
        for i, kind in enumerate(("backend_error", "env_error", "env_timeout"))
    ]
    policy = trajectory(3, "b", (), (1, 2), (0, 0), "error", error=Failure("template_error", "x"))
    won = trajectory(4, "b", (1.0,), (1, 2, 3), (0, 0, 1), "terminated")
    m = rollout_metrics([*failed, policy, won])
    assert m["infra_failures"] == 3 and m["rewarded_episodes"] == 2
    assert (m["mean_total_reward"], m["min_total_reward"], m["max_total_reward"]) == (0.5, 0.0, 1.0)
    only_failed = rollout_metrics(failed)
    assert only_failed["per_task"]["a"] == {
        "episodes": 3,
        "rewarded_episodes": 0,
        "mean_total_reward": None,
        "avg_turns_per_sample": 0.0,
        "error_rate": 1.0,
    }
    assert only_failed["mean_total_reward"] is None and only_failed["max_total_reward"] is None  # missing, not NaN


def test_no_trajectories_gives_missing_values_not_nan():
    m = rollout_metrics([])
    assert m["episodes"] == 0 and m["total_turns"] == 0
    for name in ("avg_turns_per_sample", "natural_termination_rate", "mean_total_reward", "max_total_reward"):
        assert m[name] is None
