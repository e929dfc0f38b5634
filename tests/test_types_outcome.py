"""``Trajectory.ending`` and what is read from it (the three flags, ``outcome``: which failures are the
infrastructure's), ``retries``, and the JSON round trip, records written before ``ending`` included."""

import json

import pytest

from rollforge.endings import ENDINGS
from rollforge.types import INFRA_FAILURES, Failure, Message, Trajectory


def make(**changes) -> Trajectory:
    fields = dict(
        index=0,
        task_name="t",
        messages=(Message("user", "q"),),
        token_ids=(1, 2),
        loss_mask=(0, 1),
        logprobs=(None, -0.1),
        prompt_length=1,
        rewards=(1.0,),
        total_reward=1.0,
        turns=1,
    )
    fields.update(changes)
    return Trajectory(**fields)


@pytest.mark.parametrize(
    "kind, outcome",
    [
        ("backend_error", "infra_failure"),
        ("env_error", "infra_failure"),
        ("env_timeout", "infra_failure"),
        ("episode_timeout", "infra_failure"),
        ("reward_unavailable", "infra_failure"),
        ("template_error", "policy_failure"),
        ("tool_raised", "policy_failure"),
    ],
)
def test_an_error_is_the_infrastructures_or_the_policys(kind, outcome):
    assert make(ending="error", error=Failure(kind, "x")).outcome == outcome


def test_episodes_without_an_error_completed_however_they_ended():
    assert make(ending="terminated").outcome == "completed"
    assert make(ending="truncated", failures=(Failure("tool_invalid_json", "x"),)).outcome == "completed"
    assert make(ending="max_turns_reached").outcome == "completed"
    assert INFRA_FAILURES == {"backend_error", "env_error", "env_timeout", "episode_timeout", "reward_unavailable"}


def test_retries_round_trip_and_default_to_zero():
    record = json.loads(json.dumps(make(ending="error", error=Failure("backend_error", "down"), retries=2).to_json()))
    assert record["retries"] == 2
    back = Trajectory.from_json(record)
    assert back.retries == 2 and back.outcome == "infra_failure"
    del record["retries"]  # written before retries existed
    assert Trajectory.from_json(record).retries == 0


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_ending_is_one_field_and_the_flags_are_read_from_it(ending):
    error = Failure("env_error", "boom") if ending == "error" else None
    t = make(ending=ending, error=error)
    flags = {"terminated": t.terminated, "truncated": t.truncated, "max_turns_reached": t.max_turns_reached}
    assert flags == {name: name == ending for name in flags}
    record = json.loads(json.dumps(t.to_json()))
    assert {name: record[name] for name in flags} == flags and "ending" not in record  # the format as it was
    assert Trajectory.from_json(record) == t


# A line of trajectories.jsonl as rollforge wrote it before ``ending`` was one field (three flags).
OLD_LINE = (
    '{"index": 4, "task_name": "catch", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", '
    '"content": "a"}], "token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [null, -0.5, -0.25], '
    '"prompt_length": 1, "prompt_messages": 1, "rewards": [0.0, 1.0], "total_reward": 1.0, "turns": 2, '
    '"terminated": false, "truncated": true, "max_turns_reached": false, "error": null, "failures": [], '
    '"metadata": null, "tools": [], "generation_seconds": 0.5, "environment_seconds": 0.25, "retries": 0}'
)


def test_an_old_trajectory_line_still_loads_with_its_ending():
    t = Trajectory.from_json(OLD_LINE)
    assert t.ending == "truncated" and t.truncated and not t.terminated and t.outcome == "completed"
    assert t.to_json() == json.loads(OLD_LINE)  # written back unchanged
    failed = json.loads(OLD_LINE) | {"truncated": False, "error": {"kind": "backend_error", "message": "down"}}
    assert Trajectory.from_json(failed).ending == "error"
