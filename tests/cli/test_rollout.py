"""``rollforge rollout``'s writing of results: whole lines in ``.partial`` whatever fails, a failing
write that does not lose the rollout, and ``--episode-timeout``."""

from __future__ import annotations

import asyncio
import errno
import json
import os

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.cli import rollout as cli_rollout
from rollforge.cli.main import build_parser
from rollforge.cli.rollout import PartialWriter, read_partial, run_with_progress
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


def test_a_failing_partial_write_is_reported_and_every_episode_still_lands(tiny_model_dir, tmp_path, monkeypatch, capsys):
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    backend = ScriptedBackend(lambda r: "ok", renderer, end_token_id=renderer.stop_token_ids[0])
    appended = []

    def full_disk_after_two(self, record):
        if len(appended) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        appended.append(record["index"])

    monkeypatch.setattr(PartialWriter, "append", full_disk_after_two)
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(5)]
    result = asyncio.run(run_with_progress(samples, {"default": FactoryEnvironment(Echo)}, backend, renderer,
                                           RolloutConfig(), tmp_path))
    assert result.metrics["on_episode_errors"] == 3 and len(appended) == 2
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2, 3, 4]
    assert not (tmp_path / "trajectories.jsonl.partial").exists()


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
