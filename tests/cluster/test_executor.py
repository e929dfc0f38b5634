"""``--executor ray`` end to end: `rollforge rollout` on the tiny model with environments on Ray
actors gives the same trajectories as a local run."""

from __future__ import annotations

import pytest

from rollforge.chat.render import ChatRenderer
from rollforge.cli.main import main
from rollforge.models import load_model

from test_cli import check_records, run_rollout

pytestmark = pytest.mark.slow


def test_rollout_cli_with_environments_on_ray_matches_local(ray_session, tiny_model_dir, tmp_path):
    common = ("--mode", "lockstep", "--seed", "3", "--concurrency", "1")  # same batches: bitwise equal
    local, _ = run_rollout(str(tiny_model_dir), tmp_path / "local", *common)
    remote, metrics = run_rollout(
        str(tiny_model_dir),
        tmp_path / "ray",
        *common,
        "--executor",
        "ray",
        "--env-actors",
        "2",
        "--env-actor-cpus",
        "0",
    )
    _, tokenizer = load_model(tiny_model_dir)
    check_records(remote, metrics, ChatRenderer(tokenizer))
    keys = ("token_ids", "loss_mask", "logprobs", "rewards", "messages", "error")
    assert [[r[k] for k in keys] for r in remote] == [[r[k] for k in keys] for r in local]


def test_bad_ray_options_are_named(ray_session, tmp_path, capsys):
    assert main(["rollout", "--env", "echo", "--out", str(tmp_path), "--executor", "ray", "--env-actors", "0"]) == 2
    assert "env_actors" in capsys.readouterr().err
