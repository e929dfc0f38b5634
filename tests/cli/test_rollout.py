"""``rollforge rollout``'s writing of results: whole lines in ``.partial`` whatever fails, the first
failing write stops the rollout and leaves nothing half-written, ``--episode-timeout``, and prompts
that leave no room under ``--max-seq-len`` with their tools refused before the model loads."""

from __future__ import annotations

import asyncio
import errno
import os
import re

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.cli import rollout as cli_rollout
from rollforge.cli import rollout_results
from rollforge.cli.main import build_parser, main
from rollforge.cli.rollout_results import PartialWriter, read_partial, run_with_progress
from rollforge.envs.factory import FactoryEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.types import Sample


def test_a_write_that_fails_part_way_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "trajectories.jsonl.partial"
    real_write = os.write
    with PartialWriter(path) as writer:
        writer.append({"index": 0, "text": "first"})

        def disk_full_halfway(fd, data):
            real_write(fd, data[: len(data) // 2])  # the kernel took half, then the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", disk_full_halfway)
        with pytest.raises(OSError, match="No space left"):
            writer.append({"index": 1, "text": "second " * 100})
        monkeypatch.setattr(os, "write", real_write)
        writer.append({"index": 2, "text": "third"})  # space again: appending goes on after the last whole line
    assert path.read_text().endswith("\n")
    assert [r["index"] for r in read_partial(path)] == [0, 2]


def test_read_partial_skips_an_incomplete_last_line(tmp_path):
    path = tmp_path / "x.partial"
    path.write_text('{"index": 0}\n{"index": 1}\n{"index": 2, "tok')  # the machine lost power mid-line
    assert read_partial(path) == [{"index": 0}, {"index": 1}]


class Echo:
    def reset(self, **kwargs) -> None:
        return None


def test_the_first_failing_write_stops_the_rollout_and_keeps_what_was_written(
    tiny_model_dir, tmp_path, monkeypatch, caplog
):
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    backend = ScriptedBackend(lambda r: "ok", renderer, end_token_id=renderer.stop_token_ids[0])
    real_append, real_write = PartialWriter.append, os.write
    calls = []

    def full_disk_after_two(self, record):
        calls.append(record["index"])
        if len(calls) <= 2:
            return real_append(self, record)

        def half_then_full(fd, data):
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(os, "write", half_then_full)
            return real_append(self, record)

    monkeypatch.setattr(PartialWriter, "append", full_disk_after_two)
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(40)]
    config = RolloutConfig(concurrency=1)
    with pytest.raises(OSError) as caught:
        asyncio.run(
            run_with_progress(samples, {"default": FactoryEnvironment(Echo)}, backend, renderer, config, tmp_path)
        )
    partial = tmp_path / "trajectories.jsonl.partial"
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(partial)
    assert len(calls) == 3  # the rollout stopped at the first failure: no write was tried after it
    assert [r["index"] for r in read_partial(partial)] == [0, 1] and partial.read_text().endswith("\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trajectories.jsonl.partial"]
    assert "on_episode raised" not in caplog.text


def test_a_final_write_that_fails_leaves_no_half_written_file(tmp_path, monkeypatch):
    def full(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[:3])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rollout_results.Path, "write_text", full)
    with pytest.raises(OSError) as caught:
        rollout_results.write_results(tmp_path, [], {"episodes": 0})
    assert caught.value.filename == str(tmp_path / "trajectories.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_episode_timeout_is_a_flag_with_a_bounded_default(monkeypatch, tmp_path):
    parser = build_parser()
    assert parser.parse_args(["rollout", "--out", str(tmp_path)]).episode_timeout == 1800.0
    args = parser.parse_args(["rollout", "--out", str(tmp_path), "--episode-timeout", "90"])
    seen = {}

    def stop_before_loading(name):  # the config is built before the model is loaded
        raise SystemExit(0)

    real_build = RolloutConfig.build

    def build(**values):
        seen.update(values)
        return real_build(**values)

    monkeypatch.setattr(RolloutConfig, "build", staticmethod(build))
    monkeypatch.setattr("rollforge.models.load_tokenizer", stop_before_loading)
    with pytest.raises(SystemExit):
        cli_rollout.run(args)
    assert seen["episode_timeout"] == 90.0


def test_prompts_too_long_with_their_tools_are_refused_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """catch's prompt fits 400 tokens alone but not with its tools' description: the engine's check
    runs in the CLI with the environments' tools, names the flag, and nothing is loaded or written."""

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the prompts were checked")

    monkeypatch.setattr("rollforge.cluster.generation.open_generation", no_model)
    out = tmp_path / "out"
    capsys.readouterr()
    code = main(
        [
            "rollout",
            "--model",
            str(tiny_model_dir),
            "--env",
            "catch",
            "--episodes",
            "2",
            "--max-seq-len",
            "400",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert re.fullmatch(
        r"rollforge: error: --max-seq-len=400 leaves no room to generate: prompt 1 is already \d+ tokens "
        r"with the description of its tools \(and 1 more prompts\); raise --max-seq-len or shorten the "
        r"prompts\n",
        err,
    ), err
    assert not out.exists()
