"""Prompt sources: files, rows to samples, and a seeded order that resumes exactly."""

import json

import pytest

from rollforge.errors import ConfigError
from rollforge.inputs.config import EnvConfig
from rollforge.inputs.data import PromptSource, check_prompt_lengths, generated_samples, load_rows, rows_to_samples
from rollforge.types import Message, Sample


def _samples(n):
    return [Sample((Message("user", str(i)),)) for i in range(n)]


def test_epochs_reshuffle_and_resume_draws_the_same_prompts():
    source = PromptSource(_samples(10), seed=3)
    drawn = [s.prompt[0].content for s in source.next_batch(7)]
    state = source.state()
    rest = [s.prompt[0].content for s in source.next_batch(8)]  # crosses into epoch 1
    assert sorted(drawn + rest[:3]) == [str(i) for i in range(10)]  # epoch 0: each prompt once
    resumed = PromptSource(_samples(10), seed=3)
    resumed.load_state(state)
    assert [s.prompt[0].content for s in resumed.next_batch(8)] == rest
    with pytest.raises(ConfigError, match="10 prompts but the data now has 9"):
        PromptSource(_samples(9), seed=3).load_state(state)


def test_rows_become_samples_with_their_columns(tmp_path):
    rows = [
        {"prompt": "Add 2 and 3.", "answer": 5},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "task_name": "b"},
        {"prompt": "Play.", "environment": "b"},
    ]
    samples = rows_to_samples(rows[:1], ["a"], system_prompt="You add.")
    assert [m.role for m in samples[0].prompt] == ["system", "user"] and samples[0].row == {"answer": 5}
    samples = rows_to_samples(rows[1:], ["a", "b"])
    assert [s.task_name for s in samples] == ["b", "b"]
    assert samples[0].prompt[0] == Message("system", "Be brief.")
    with pytest.raises(ConfigError, match="row 1 has no task_name column and there are several"):
        rows_to_samples(rows[:1], ["a", "b"])
    with pytest.raises(ConfigError, match="row 1 has no 'prompt' column"):
        rows_to_samples([{"question": "x"}], ["a"])


def test_jsonl_json_and_parquet_files(tmp_path):
    rows = [{"prompt": "p1", "x": 1}, {"prompt": "p2", "x": 2}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.jsonl", "d.json", "d.parquet"):
        assert load_rows(tmp_path / name) == rows
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert load_rows(tmp_path / "saved") == rows
    with pytest.raises(ConfigError, match="expected .jsonl, .json, .parquet"):
        (tmp_path / "d.csv").write_text("prompt\n")
        load_rows(tmp_path / "d.csv")


def test_generators_share_prompts_by_weight():
    samples = generated_samples([EnvConfig(name="arithmetic", weight=3), EnvConfig(name="guess_number")], 8, 0)
    tasks = [s.task_name for s in samples]
    assert tasks.count("arithmetic") == 6 and tasks.count("guess_number") == 2
    assert tasks[:4] == ["arithmetic", "arithmetic", "guess_number", "arithmetic"]  # interleaved in proportion
    with pytest.raises(ConfigError, match="has no prompt generator"):
        generated_samples([EnvConfig(name="mymod:Env")], 4, 0)


def test_malformed_files_name_the_file_and_line(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n\n{"prompt": "b",}\n')
    with pytest.raises(
        ConfigError, match=r"p.jsonl' line 3 is not valid JSON: Expecting property name .*\(column 16\)"
    ):
        load_rows(jsonl)
    whole = tmp_path / "p.json"
    whole.write_text('[{"prompt": "a"},\n {"prompt": }]')
    with pytest.raises(ConfigError, match=r"p.json' line 2 is not valid JSON"):
        load_rows(whole)
    jsonl.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match=r"p.jsonl' is not UTF-8 text \(invalid continuation byte at byte 15\)"):
        load_rows(jsonl)
    jsonl.write_text('{"prompt": "one\u2028line"}\n', encoding="utf-8")  # a line separator inside a JSON string
    assert load_rows(jsonl) == [{"prompt": "one\u2028line"}]


class _CharRenderer:
    """One token per character; a 2-token generation prompt."""

    generation_prompt = [0, 0]

    def prompt_ids(self, messages):
        return [0] * sum(len(m.content) for m in messages)


def test_prompts_that_leave_no_room_to_generate_are_refused():
    samples = [Sample((Message("user", "x" * n),)) for n in (5, 8, 3, 9)]
    check_prompt_lengths(samples, _CharRenderer(), 12, "max_seq_len")  # the longest, 9 + 2 = 11, leaves one token
    with pytest.raises(ConfigError) as caught:
        check_prompt_lengths(samples, _CharRenderer(), 10, "rollout.max_seq_len")
    # prompt 2 is 8 + 2 = 10 tokens: the sequence is full before the first generated token; prompt 4 too
    assert str(caught.value) == (
        "rollout.max_seq_len=10 leaves no room to generate: prompt 2 is already 10 tokens (and 1 more prompts); "
        "raise rollout.max_seq_len or shorten the prompts"
    )
