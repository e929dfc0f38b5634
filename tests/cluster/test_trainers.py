"""Training ranks on Ray actors (``ray.training_workers``): the same run as torchrun's ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rollforge.errors import ConfigError
from rollforge.recipes.launch import train
from rollforge.testing import first_character_rows
from rollforge.train.config import load_config

pytestmark = pytest.mark.slow

#: What differs between any two runs: wall times and the rates derived from them.
TIMED = ("time/", "tokens_per_second", "rollout/")


def _settings(tmp_path, tiny_model_dir) -> dict:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in first_character_rows(64)))
    return {
        "model": {"name": str(tiny_model_dir)},
        "data": {"path": str(data)},
        "steps": 3,
        "seed": 1,
        "environments": [{"name": "rollforge.testing:FirstCharacter", "task_name": "first"}],
        "algorithm": {"batch_size": 4, "group_size": 8},
        "rollout": {"max_new_tokens": 2, "max_turns": 1},
        "optim": {"lr": 1e-3},
        "checkpoint_every": 0,
        "save_trajectories": False,
        "executor": "ray",
        "ray": {"env_actors": 1, "env_actor_cpus": 0},
    }


def test_ray_training_workers_match_torchrun_ranks(ray_session, tiny_model_dir, tmp_path):
    settings = _settings(tmp_path, tiny_model_dir)
    config_file = tmp_path / "torchrun.yaml"
    local = {key: value for key, value in settings.items() if key != "ray"}  # ray.* needs executor: ray
    config_file.write_text(json.dumps({**local, "out": str(tmp_path / "torchrun"), "executor": "local"}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "rollforge",
            "train",
            str(config_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = [json.loads(line) for line in (tmp_path / "torchrun" / "metrics.jsonl").read_text().splitlines()]

    ray = {**settings["ray"], "training_workers": 2, "training_worker_cpus": 1}
    config = load_config(**{**settings, "out": str(tmp_path / "ray"), "ray": ray})
    result = train(config, console=False)
    assert result.steps == 3 and [m["step"] for m in result.history] == [1, 2, 3]
    for got, want in zip(result.history, expected, strict=True):
        assert got["ranks"] == want["ranks"] == 2
        keys = {k for k in want if not k.startswith(TIMED)}
        assert keys <= set(got)
        for key in keys:
            if isinstance(want[key], float):
                assert got[key] == pytest.approx(want[key], abs=1e-4), key
            else:
                assert got[key] == want[key], key


def test_too_many_training_workers_is_one_clear_error(ray_session, tiny_model_dir, tmp_path):
    settings = _settings(tmp_path, tiny_model_dir)
    ray = {**settings["ray"], "training_workers": 3, "training_worker_cpus": 2}
    config = load_config(**{**settings, "out": str(tmp_path / "ray"), "ray": ray})
    with pytest.raises(
        ConfigError,
        match=r"the actors reserve 6 CPUs \(3 training workers x 2\) but the Ray cluster "
        r"has 2; lower .*ray.training_worker_cpus",
    ):
        train(config, console=False)
