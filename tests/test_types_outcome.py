"""``Trajectory.outcome`` and ``retries``: which failures are the infrastructure's, and the JSON round trip."""

import json

import pytest

from rollforge.types import INFRA_FAILURES, Failure, Message, Trajectory


def make(**changes) -> Trajectory:
    fields = dict(index=0, task_name="t", messages=(Message("user", "q"),), token_ids=(1, 2), loss_mask=(0, 1),
                  logprobs=(None, -0.1), prompt_length=1, rewards=(1.0,), total_reward=1.0, turns=1)
    fields.update(changes)
    return Trajectory(**fields)


@pytest.mark.parametrize("kind, outcome", [
    ("backend_error", "infra_failure"), ("env_error", "infra_failure"), ("env_timeout", "infra_failure"),
    ("episode_timeout", "infra_failure"), ("reward_unavailable", "infra_failure"), ("template_error", "policy_failure"),
    ("tool_raised", "policy_failure"),
])
def test_an_error_is_the_infrastructures_or_the_policys(kind, outcome):
    assert make(error=Failure(kind, "x")).outcome == outcome


def test_episodes_without_an_error_completed_however_they_ended():
    assert make(terminated=True).outcome == "completed"
    assert make(truncated=True, failures=(Failure("tool_invalid_json", "x"),)).outcome == "completed"
    assert make(max_turns_reached=True).outcome == "completed"
    assert INFRA_FAILURES == {"backend_error", "env_error", "env_timeout", "episode_timeout", "reward_unavailable"}


def test_retries_round_trip_and_default_to_zero():
    record = json.loads(json.dumps(make(error=Failure("backend_error", "down"), retries=2).to_json()))
    assert record["retries"] == 2
    back = Trajectory.from_json(record)
    assert back.retries == 2 and back.outcome == "infra_failure"
    del record["retries"]  # written before retries existed
    assert Trajectory.from_json(record).retries == 0
