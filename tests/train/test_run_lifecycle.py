"""``rollforge train`` says what it did: a resume with a changed config is refused naming the keys, a
resume with nothing left says so, a step without an optimizer step says why, the end prints a
summary and writes the report, a failed start leaves no config.yaml, and ``--nproc`` checks the
ranks before torchrun starts."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from rollforge.cli.main import main
from rollforge.errors import ConfigError
from rollforge.recipes.launch import train
from rollforge.train.config_files import changed_keys, check_unchanged


def _config_file(tiny_config, tmp_path, *overrides):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny_config(*overrides).model_dump(mode="json")))
    return path


def _run(capsys, argv):
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_changed_keys_name_each_leaf_with_both_values():
    recorded = {"steps": 3, "algorithm": {"batch_size": 2, "group_size": 8}, "environments": [{"name": "a"}]}
    current = {"steps": 4, "algorithm": {"batch_size": 4, "group_size": 8}, "environments": [{"name": "b"}], "new": 1}
    assert changed_keys(recorded, current) == [
        "steps 3 -> 4",
        "algorithm.batch_size 2 -> 4",
        "environments [{'name': 'a'}] -> [{'name': 'b'}]",
    ]  # "new" only one side has: a field of another rollforge version, not the user's change


def test_resume_with_a_changed_config_is_refused_and_a_finished_run_has_nothing_to_do(tiny_config, tmp_path, capsys):
    config = _config_file(tiny_config, tmp_path, "steps=1", "checkpoint_every=1")
    out = tmp_path / "run"
    assert main(["train", str(config)]) == 0
    recorded, metrics = (out / "config.yaml").read_text(), (out / "metrics.jsonl").read_text()

    code, stdout, err = _run(capsys, ["train", str(config), "--resume", "--set", "algorithm.batch_size=8"])
    assert code == 2 and stdout == "" and err.count("\n") == 1
    assert err.startswith("rollforge: error: --resume with a changed config: algorithm.batch_size 4 -> 8 (")
    assert "may change only out, steps," in err and "start over with --overwrite or another out" in err
    assert (out / "config.yaml").read_text() == recorded  # not rewritten

    code, stdout, err = _run(capsys, ["train", str(config), "--resume"])
    assert code == 0 and stdout == (
        f"nothing to do: the run in {str(out)!r} finished step 1 and steps is 1; to train further, "
        "resume with a larger steps (--set steps=2 or more)\n"
    )
    assert (out / "metrics.jsonl").read_text() == metrics

    code, stdout, err = _run(capsys, ["train", str(config), "--resume", "--set", "steps=2"])  # steps may grow
    assert code == 0 and stdout.startswith("trained 1 step (2-2), 1 optimizer update; reward/mean ")
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 2


def test_the_library_refuses_a_changed_config_on_resume_too(tiny_config):
    first = train(tiny_config("steps=1", "checkpoint_every=1"), console=False)
    with pytest.raises(ConfigError, match=r"changed config: rollout.max_new_tokens 2 -> 3 \("):
        train(tiny_config("steps=2", "checkpoint_every=1", "rollout.max_new_tokens=3"), resume=True, console=False)
    check_unchanged(first.out, tiny_config("steps=5", "keep_checkpoints=4", "report_to=[]"))  # allowed changes


def test_a_step_without_an_update_says_so_and_the_end_counts_updates_honestly(tiny_config, tmp_path, capsys):
    """Without a reward (environment weight 0, no reward function) every group's rewards are equal:
    no optimizer step runs."""
    config = _config_file(tiny_config, tmp_path, "steps=2", "algorithm.env_reward_weight=0")
    code, stdout, err = _run(capsys, ["train", str(config)])
    assert code == 0
    steps = [line for line in err.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("no update: all 4 groups had equal rewards" in line for line in steps)
    assert all(" loss " not in line for line in steps)
    run = tmp_path / "run"
    first, second = stdout.splitlines()
    assert re.fullmatch(
        r"trained 2 steps \(1-2\), 0 optimizer updates \(no update in 2 steps: all 4 groups had equal rewards\); "
        r"reward/mean 0.000 \(step 1\) -> 0.000 \(step 2\); wall time \d+s",
        first,
    )
    assert second == f"run: {run} (rollforge view {run}) -- report: {run / 'report.md'}"
    report = (run / "report.md").read_text()
    assert "- Steps: 2 (0 optimizer updates)" in report and "![reward curve](reward_curve.png)" in report
    assert (run / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # as the quickstart gets


def test_a_start_that_fails_leaves_no_config_yaml(tiny_config, tiny_model_dir, tmp_path, capsys):
    """The tokenizer loads (the preflight passes, config.yaml is written), the weights do not."""
    broken = tmp_path / "tokenizer-only"
    broken.mkdir()
    for file in tiny_model_dir.iterdir():
        if file.suffix != ".safetensors":
            (broken / file.name).write_bytes(file.read_bytes())
    config = _config_file(tiny_config, tmp_path, f"model.name={broken}")
    code, _, err = _run(capsys, ["train", str(config)])
    assert code == 2 and "rollforge: error:" in err
    assert not (tmp_path / "run").exists()  # neither config.yaml nor the directory it made


def test_nproc_with_a_batch_that_does_not_split_is_refused_once_before_torchrun(
    tiny_config, tmp_path, capsys, monkeypatch
):
    launched = []
    monkeypatch.setattr(subprocess, "call", lambda command: launched.append(command) or 0)
    config = _config_file(tiny_config, tmp_path, "algorithm.batch_size=3")
    code, _, err = _run(capsys, ["train", str(config), "--nproc", "2"])
    assert code == 2 and not launched
    assert err == (
        "rollforge: error: algorithm.batch_size=3 prompts cannot be split evenly over 2 ranks: use a multiple of 2\n"
    )
    assert main(["train", str(_config_file(tiny_config, tmp_path, "algorithm.batch_size=4")), "--nproc", "2"]) == 0
    assert len(launched) == 1 and "--nproc-per-node" in launched[0]
