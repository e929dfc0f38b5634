"""Trajectory invariants are checked on construction; a violation is an InvariantError."""

import json

import pytest

from rollforge.errors import InvariantError
from rollforge.types import Completion, Failure, Message, Sample, Segment, ToolCall, Trajectory


def make(**changes):
    fields = dict(
        index=3,
        task_name="t",
        messages=(Message("user", "q"), Message("assistant", "a")),
        token_ids=(1, 2, 3, 4),
        loss_mask=(0, 0, 1, 1),
        logprobs=(None, None, -0.1, -0.2),
        prompt_length=2,
        rewards=(0.5, 0.25),
        total_reward=0.75,
        turns=2,
        ending="terminated",
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
        (dict(ending="done"), "ending 'done' with error None; the ending is one of terminated, truncated"),
        (dict(ending="error"), "ending 'error' with error None"),
        (dict(ending="max_turns_reached", error=Failure("env_error", "boom")), "'error' exactly when an error is set"),
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


def test_messages_carry_tool_calls_and_ids_in_the_openai_shape():
    call = ToolCall("move", {"to": "left"}, "abc123XYZ")
    assistant = Message("assistant", "[TOOL_CALLS] ...", tool_calls=(call, ToolCall("", {}, error="bad json")))
    assert assistant.to_chat() == {
        "role": "assistant",
        "content": "[TOOL_CALLS] ...",
        "tool_calls": [
            {"id": "abc123XYZ", "type": "function", "function": {"name": "move", "arguments": {"to": "left"}}}
        ],
    }
    result = Message("tool", "moved", name="move", tool_call_id="abc123XYZ")
    assert result.to_chat() == {"role": "tool", "content": "moved", "name": "move", "tool_call_id": "abc123XYZ"}
    assert Message.coerce(result.to_chat()) == result
    assert Message.coerce(assistant.to_chat()).tool_calls == (call,)  # a dataset's few-shot calls are kept
    wire = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "move", "arguments": '{"to": "left"}'}}],
    }
    assert Message.coerce(wire).tool_calls == (ToolCall("move", {"to": "left"}, "c"),)


def test_a_trajectory_reads_back_from_its_json_segments_and_images_included():
    segments = (Segment((1, 2, 3), (0, 0, 1), (None, None, -0.5), 2, 2), Segment((4, 5), (0, 1), (None, -0.25), 1, 4))
    messages = (
        Message("user", "q"),
        Message("assistant", "a", tool_calls=(ToolCall("f", {"x": 1}, "c1"),)),
        Message("tool", "r", name="f", images=(b"\x89PNG...",), tool_call_id="c1"),
        Message("assistant", "b"),
    )
    t = make(
        messages=messages,
        token_ids=(1, 2, 3, 4, 5),
        loss_mask=(0, 0, 1, 0, 1),
        logprobs=(None, None, -0.5, None, -0.25),
        segments=segments,
        ending="error",
        error=Failure("env_error", "x"),
    )
    record = json.loads(json.dumps(t.to_json()))
    assert record["segments"][1] == {
        "token_ids": [4, 5],
        "loss_mask": [0, 1],
        "logprobs": [None, -0.25],
        "prompt_length": 1,
        "messages": 4,
    }
    assert Trajectory.from_json(record) == t
    assert Trajectory.from_json({**record, "reward": 1.0, "advantage": 0.5}) == t  # a trainer's trajectories.jsonl
    one = make()
    assert "segments" not in one.to_json() and one.segments == (
        Segment((1, 2, 3, 4), (0, 0, 1, 1), (None, None, -0.1, -0.2), 2, 2),
    )
    assert Trajectory.from_json(json.loads(json.dumps(one.to_json()))) == one


def test_segments_must_lay_end_to_end_into_the_ids():
    with pytest.raises(InvariantError, match="segments laid end to end"):
        make(segments=(Segment((1, 2), (0, 0), (None, None), 2, 1), Segment((3,), (1,), (-0.1,), 0, 2)))


def test_non_finite_numbers_read_back_from_strict_json():
    t = make(logprobs=(None, None, float("-inf"), -0.2))
    record = json.loads(json.dumps(t.to_json(), allow_nan=False))
    assert record["logprobs"][2] == "-Infinity" and Trajectory.from_json(record) == t


def test_a_trajectory_reads_back_from_the_raw_line_of_trajectories_jsonl(tmp_path):
    t = make(logprobs=(None, None, float("-inf"), -0.2))
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(t.to_json()) + "\n")
    with path.open() as lines:
        line = next(lines)  # as the README reads it, newline included
    assert Trajectory.from_json(line) == Trajectory.from_json(line.encode()) == t
