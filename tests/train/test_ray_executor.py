"""Training with ``executor: ray``: environments on Ray actors, same run as a local one."""

from __future__ import annotations

import json

import pytest

from rollforge.errors import ConfigError
from rollforge.train.loop import train

pytestmark = pytest.mark.slow

#: Differ between any two runs; logprobs differ by float noise when the HF backend's batches differ.
TIMING = {"generation_seconds", "environment_seconds", "logprobs"}


def test_training_with_environments_on_ray_matches_a_local_run(ray_session, tiny_config, tmp_path):
    # One request at a time: the HF backend's batches (hence float noise in sampling) cannot depend
    # on when an actor's answer arrives.
    serial = "rollout.concurrency=1"
    local = train(tiny_config(f"out={tmp_path / 'local'}", serial), console=False)
    remote = train(
        tiny_config(f"out={tmp_path / 'ray'}", serial, "executor=ray", "ray.env_actors=2", "ray.env_actor_cpus=0"),
        console=False,
    )
    assert [m["step"] for m in remote.history] == [1, 2, 3]
    for step in (1, 2, 3):
        a = (local.out / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()
        b = (remote.out / "trajectories" / f"step-{step:06d}.jsonl").read_text().splitlines()
        for x, y in zip(map(json.loads, a), map(json.loads, b), strict=True):
            assert {k: v for k, v in y.items() if k not in TIMING} == {k: v for k, v in x.items() if k not in TIMING}
            assert max(abs((p or 0) - (q or 0)) for p, q in zip(x["logprobs"], y["logprobs"], strict=True)) < 1e-4

    assert [m["reward/mean"] for m in remote.history] == [m["reward/mean"] for m in local.history]
    assert not [k for m in remote.history for k in m if k.startswith("rollout/errors/")]


def test_executor_must_be_local_or_ray(tiny_config):
    with pytest.raises(ConfigError, match="executor"):
        tiny_config("executor=dask")
    with pytest.raises(ConfigError, match="ray.env_actors"):
        tiny_config("executor=ray", "ray.env_actors=0")


def test_training_with_generation_replicas_on_ray_keeps_them_in_sync(ray_session, tiny_config, tmp_path):
    """Two HF replicas of the policy on Ray actors generate; after every update both must serve the
    new weights, or the next step's importance ratios (trainer / generation logprobs) leave 1."""
    result = train(
        tiny_config(
            f"out={tmp_path / 'replicas'}", "executor=ray", "ray.env_actor_cpus=0",
            "ray.generation_replicas=2", "ray.replica_cpus=0",
        ),
        console=False,
    )
    assert [m["step"] for m in result.history] == [1, 2, 3]
    assert not [k for m in result.history for k in m if k.startswith("rollout/errors/")]
    for m in result.history:
        assert abs(m["mean_ratio"] - 1) < 1e-3 and m["clip_fraction"] == 0, m


def test_train_cli_executor_flags_become_config_overrides():
    from rollforge.cli.main import build_parser
    from rollforge.cli.train import _overrides
    from rollforge.train.config import load_config

    args = build_parser().parse_args(
        ["train", "x.yaml", "--executor", "ray", "--ray-address", "ray://head:10001", "--set", "steps=2"]
    )
    config = load_config(None, _overrides(args))
    assert (config.executor, config.ray.address, config.steps) == ("ray", "ray://head:10001", 2)
    assert load_config(None, _overrides(build_parser().parse_args(["train", "x.yaml"]))).executor == "local"
