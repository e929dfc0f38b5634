"""Trajectory invariants are checked on construction; a violation is an InvariantError."""

import json

import pytest

from rollforge.errors import InvariantError
from rollforge.types import Completion, Failure, Message, Sample, Trajectory


def make(**changes):
    fields = dict(
        index=3, task_name="t", messages=(Message("user", "q"), Message("assistant", "a")),
        token_ids=(1, 2, 3, 4), loss_mask=(0, 0, 1, 1), logprobs=(None, None, -0.1, -0.2), prompt_length=2,
        rewards=(0.5, 0.25), total_reward=0.75, turns=2, terminated=True,
    )
    fields.update(changes)
    return Trajectory(**fields)


def test_a_valid_trajectory_serialises_every_documented_field():
    record = json.loads(json.dumps(make().to_json()))
    assert record["logprobs"] == [None, None, -0.1, -0.2] and record["loss_mask"] == [0, 0, 1, 1]
    assert record["error"] is None and record["total_reward"] == 0.75 and record["turns"] == 2
    assert repr(make()) == "Trajectory(index=3, task_name='t', turns=2, tokens=4, total_reward=0.75, terminated)"


def test_trajectory_json_is_strict_without_nan_or_infinity():
    def refuse(constant):
        raise ValueError(f"bare {constant} in trajectory JSON")

    trajectory = make(
        logprobs=(None, None, float("-inf"), -0.2),
        rewards=(float("inf"), 0.25),
        total_reward=float("inf"),
        metadata={"score": float("nan"), "bounds": [float("-inf"), 1.5], "nested": ({"x": float("inf")},)},
        generation_seconds=float("nan"),
    )
    line = json.dumps(trajectory.to_json())
    record = json.loads(line, parse_constant=refuse)
    assert record["logprobs"] == [None, None, "-Infinity", -0.2]
    assert record["rewards"] == ["Infinity", 0.25] and record["total_reward"] == "Infinity"
    assert record["metadata"] == {"score": "NaN", "bounds": ["-Infinity", 1.5], "nested": [{"x": "Infinity"}]}
    assert record["generation_seconds"] == "NaN" and record["environment_seconds"] == 0.0
    assert float(record["logprobs"][2]) == float("-inf")  # the strings read back with float()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(loss_mask=(0, 1, 1)), "4 token ids, 3 mask entries"),
        (dict(logprobs=(None, -0.3, -0.1, -0.2)), "token 1 has mask 0"),
        (dict(logprobs=(None, None, None, -0.2)), "token 2 has mask 1"),
        (dict(loss_mask=(0, 0, 2, 1)), "token 2 has mask 2"),
        (dict(rewards=(0.5,)), "2 turns, 1 rewards"),
        (dict(total_reward=1.0), "not the sum"),
        (dict(truncated=True), "at most one"),
        (dict(terminated=False, error=Failure("env_error", "boom"), max_turns_reached=True), "at most one"),
    ],
)
def test_broken_invariants_are_caught(changes, message):
    with pytest.raises(InvariantError, match=message):
        make(**changes)


def test_completion_and_sample_checks():
    with pytest.raises(InvariantError, match="2 token ids but 1 logprobs"):
        Completion((1, 2), (-0.1,), "stop")
    with pytest.raises(InvariantError, match="at least one prompt message"):
        Sample(prompt=())
    with pytest.raises(InvariantError, match="role"):
        Sample(prompt=[{"role": "robot", "content": "x"}])
    sample = Sample(prompt=[{"role": "user", "content": "x"}], row={"a": 1})
    assert sample.prompt == (Message("user", "x"),) and sample.row["a"] == 1
    with pytest.raises(TypeError):
        sample.row["a"] = 2  # rows are read-only
