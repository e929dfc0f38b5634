"""The viewer on runs as users move and leave them: a run viewed from another directory or as a
copy (its config.yaml names its model relative to where it ran), a rollout interrupted before its
``trajectories.jsonl`` was written, and a header that keeps every figure."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import yaml

from rollforge.cli.main import main
from rollforge.view.header import header
from rollforge.view.run import load_run, recorded_model, tokenizer_for

CHECKPOINT = "runs/quickstart/warmup/checkpoints/step-000016/model"  # as the quickstart records it


def record(i: int, task: str = "catch") -> dict:
    return {
        "index": i,
        "task_name": task,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
        "token_ids": [72, 105, 111, 107],
        "loss_mask": [0, 0, 1, 1],
        "logprobs": [None, None, -0.5, -0.25],
        "total_reward": 1.0,
        "turns": 1,
        "terminated": True,
    }


@pytest.fixture
def quickstart_layout(tmp_path, tiny_model_dir):
    """``WORK/runs/quickstart`` as the quickstart leaves it: a GRPO run whose config.yaml names the
    warm-up's checkpoint by the path relative to WORK, where the run was started."""
    work = tmp_path / "work"
    run = work / "runs" / "quickstart"
    shutil.copytree(tiny_model_dir, work / CHECKPOINT)
    (run / "trajectories").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"name": CHECKPOINT}}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 1.0, "micro_batches": 1}) + "\n")
    (run / "trajectories" / "step-000001.jsonl").write_text(json.dumps(record(0)) + "\n")
    return work, run


def test_a_run_viewed_from_another_directory_finds_its_model_inside_the_run(quickstart_layout, tmp_path, monkeypatch):
    _, run = quickstart_layout
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert recorded_model(CHECKPOINT, run) == str(run / "warmup/checkpoints/step-000016/model")
    assert tokenizer_for(run, None) is not None
    assert main(["view", str(run)]) == 0
    page = (run / "view.html").read_text()
    assert '"tokenizer":"' + str(run / "warmup/checkpoints/step-000016/model") in page  # ids decoded, not shown raw


def test_a_copy_of_a_run_finds_the_model_in_the_copy(quickstart_layout, tmp_path, monkeypatch):
    work, run = quickstart_layout
    copy = tmp_path / "copy-of-the-run"
    shutil.copytree(run, copy)
    shutil.rmtree(work)  # the original is gone
    monkeypatch.chdir(tmp_path)
    assert tokenizer_for(copy, None).name_or_path == str(copy / "warmup/checkpoints/step-000016/model")


def test_a_model_found_nowhere_is_one_warning_and_the_page_shows_ids(quickstart_layout, tmp_path, capsys, monkeypatch):
    _, run = quickstart_layout
    shutil.rmtree(run / "warmup")  # the checkpoint was deleted
    monkeypatch.chdir(tmp_path)  # and from here the path it records leads nowhere either
    assert main(["view", str(run)]) == 0
    err = capsys.readouterr().err
    assert f"rollforge: warning: the run's model {CHECKPOINT!r}" in err and "the page shows token ids" in err
    assert load_run(run, None).summary["tokenizer"] is None


def test_an_explicit_model_that_does_not_load_is_still_an_error(quickstart_layout, capsys):
    _, run = quickstart_layout
    assert main(["view", str(run), "--model", "./no/such/model"]) == 2
    assert "rollforge: error: model directory './no/such/model' does not exist" in capsys.readouterr().err


def test_an_interrupted_rollout_directory_is_viewed_and_exported_from_its_partial_file(tmp_path, caplog):
    run = tmp_path / "rollout"
    run.mkdir()
    partial = run / "trajectories.jsonl.partial"
    partial.write_text("".join(json.dumps(record(i)) + "\n" for i in range(3)) + '{"index": 3, "tok')  # torn
    with caplog.at_level(logging.WARNING):
        assert main(["view", str(run)]) == 0
    summary = load_run(run).summary
    assert summary["interrupted"] == str(partial) and len(summary["rows"]) == 3 and summary["kind"] == "rollout"
    assert "interrupted: the episodes written to ${S.interrupted}" in (run / "view.html").read_text()
    pytest.importorskip("datasets")
    from rollforge.export import to_dataset

    assert to_dataset(run)["index"] == [0, 1, 2]


def test_the_header_keeps_every_figure_with_the_headline_first():
    per_task = {
        task: {
            "episodes": 4,
            "rewarded_episodes": 4,
            "mean_total_reward": r,
            "avg_turns_per_sample": 2.0,
            "error_rate": 0,
        }
        for task, r in (("arithmetic", 0.25), ("catch", 0.75))
    }
    metrics = {f"figure_{i}": i for i in range(22)}  # more than the page used to show
    metrics |= {"generation_seconds": 1134.0, "environment_seconds": 20.0, "per_task": per_task}
    metrics |= {"wall_seconds": 79.0, "episodes": 8, "mean_total_reward": 0.5, "errors": {"env_error": 1}}
    items = header("rollout", metrics, [])
    labels = [label for label, _ in items]
    assert labels[:3] == ["episodes", "mean_total_reward", "wall_seconds"]
    assert labels[3:13] == [f"per_task.{t}.{k}" for t in ("arithmetic", "catch") for k in per_task[t]]
    assert ["per_task.catch.mean_total_reward", 0.75] in items and ["errors.env_error", 1] in items
    assert ["generation_seconds (sum over episodes)", 1134.0] in items and len(items) == 3 + 10 + 22 + 2 + 1


def test_a_training_header_counts_optimizer_updates_and_the_reward_of_the_first_and_last_steps():
    curve = [
        {"step": 1, "reward/mean": 0.25, "micro_batches": 2, "time/step": 3.0},
        {"step": 2, "reward/mean": 0.0, "micro_batches": 0, "time/step": 2.0},  # every group's rewards equal
        {"step": 3, "reward/mean": 0.75, "micro_batches": 1, "time/step": 4.0},
    ]
    evaluations = {"after": {"mean_reward": 0.5, "per_task": {"catch": 0.5}}}
    assert header("training", evaluations, curve) == [
        ["steps", 3],
        ["optimizer updates", 2],
        ["reward/mean first", 0.25],
        ["reward/mean last", 0.75],
        ["seconds in steps", 9.0],
        ["after.mean_reward", 0.5],
        ["after.per_task.catch", 0.5],
    ]
