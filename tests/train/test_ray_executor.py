"""Training with ``executor: ray``: environments on Ray actors, same run as a local one."""

from __future__ import annotations

import json

import pytest

from rollforge.errors import ConfigError
from rollforge.recipes.launch import train

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
            served = y.pop("served_by")  # where it ran: the one field a Ray run adds
            assert "served_by" not in x and served["environment"]["name"] in ("first/0", "first/1")
            assert {k: v for k, v in y.items() if k not in TIMING} == {k: v for k, v in x.items() if k not in TIMING}
            assert max(abs((p or 0) - (q or 0)) for p, q in zip(x["logprobs"], y["logprobs"], strict=True)) < 1e-4

    assert [m["reward/mean"] for m in remote.history] == [m["reward/mean"] for m in local.history]
    assert not [k for m in remote.history for k in m if k.startswith("rollout/errors/")]


def test_executor_must_be_local_or_ray(tiny_config):
    with pytest.raises(ConfigError, match="executor"):
        tiny_config("executor=dask")
    with pytest.raises(ConfigError, match="ray.env_actors"):
        tiny_config("executor=ray", "ray.env_actors=0")


def test_only_several_torchrun_ranks_keep_training_off_ray(monkeypatch):
    # A WORLD_SIZE of 1 (a job scheduler's, or one another library left: TRL's colocated vLLM sets
    # it) made a Ray run with training workers train here, alone.
    from rollforge.recipes.launch import started_by_torchrun

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not started_by_torchrun()
    for world, ranks in (("1", False), ("2", True), (" 4 ", True)):
        monkeypatch.setenv("WORLD_SIZE", world)
        assert started_by_torchrun() is ranks
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two' in the environment: expected a whole number"):
        started_by_torchrun()


def test_training_with_generation_replicas_on_ray_keeps_them_in_sync(ray_session, tiny_config, tmp_path):
    """Two HF replicas of the policy on Ray actors generate; after every update both must serve the
    new weights, or the next step's importance ratios (trainer / generation logprobs) leave 1."""
    result = train(
        tiny_config(
            f"out={tmp_path / 'replicas'}",
            "executor=ray",
            "ray.env_actor_cpus=0",
            "ray.generation_replicas=2",
            "ray.replica_cpus=0",
        ),
        console=False,
    )
    assert [m["step"] for m in result.history] == [1, 2, 3]
    assert not [k for m in result.history for k in m if k.startswith("rollout/errors/")]
    for m in result.history:
        assert abs(m["mean_ratio"] - 1) < 1e-3 and m["clip_fraction"] == 0, m


def test_train_cli_executor_flags_become_config_overrides():
    from rollforge.cli.main import build_parser
    from rollforge.cli.train import flag_overrides
    from rollforge.train.config import load_config

    args = build_parser().parse_args(
        ["train", "x.yaml", "--executor", "ray", "--ray-address", "ray://head:10001", "--set", "steps=2"]
    )
    config = load_config(None, flag_overrides(args))
    assert (config.executor, config.ray.address, config.steps) == ("ray", "ray://head:10001", 2)
    assert load_config(None, flag_overrides(build_parser().parse_args(["train", "x.yaml"]))).executor == "local"


def _laptop_config(tiny_model_dir, tmp_path, *sets: str) -> list[str]:
    """The README's Ray training line on the tiny model, one ``arithmetic`` environment, 1 step."""
    import yaml

    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": {"name": str(tiny_model_dir)},
                "out": str(tmp_path / "run"),
                "steps": 1,
                "environments": [{"name": "arithmetic"}],
                "algorithm": {"batch_size": 2, "group_size": 2},
                "rollout": {"max_new_tokens": 2, "max_turns": 1},
                "checkpoint_every": 0,
                "eval_episodes": 0,
            }
        )
    )
    return ["train", str(config), "--set", "executor=ray", "--set", "ray.training_workers=2", *sets]


def test_readme_ray_training_line_runs_with_the_defaults_on_two_cpus(
    ray_session, ray_cpus_free, tiny_model_dir, tmp_path, capsys
):
    """Two workers, each with two environment actors, on the 2-CPU loopback instance: every
    reservation unset, so all six share the two CPUs (they used to wait 120 s for CPUs the
    workers held)."""
    from rollforge.cli.main import main

    assert ray_session.cluster_resources()["CPU"] == 2
    assert main(_laptop_config(tiny_model_dir, tmp_path)) == 0, capsys.readouterr().err
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["ranks"]) for m in metrics] == [(1, 2)]
    assert not [k for m in metrics for k in m if k.startswith("rollout/errors/")]
    ray_cpus_free()


def test_ray_training_that_cannot_fit_is_one_line_at_once(
    ray_session, ray_cpus_free, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """2 workers x 1 CPU + 2 x 2 environment actors x 0.5 CPU = 4 CPUs on a 2-CPU instance: refused
    before anything starts (it used to start, then wait 120 s and print Ray's coloured traceback):
    no placement group is even requested."""
    import importlib

    from rollforge.cli.main import main

    groups = []  # ray.util's placement_group names the function, not its module
    module = importlib.import_module("ray.util.placement_group")
    monkeypatch.setattr(module, "placement_group", lambda *args, **kwargs: groups.append(args))
    code = main(
        _laptop_config(
            tiny_model_dir, tmp_path, "--set", "ray.training_worker_cpus=1", "--set", "ray.env_actor_cpus=0.5"
        )
    )
    err = capsys.readouterr().err
    assert code == 2 and groups == [], (code, groups, err)
    assert err.strip().splitlines() == [
        "rollforge: error: the actors reserve 4 CPUs (2 training workers x 1, 4 environment actors x 0.5) but the "
        "Ray cluster has 2; lower the reservations or the actor counts: ray.training_worker_cpus, "
        "ray.training_worker_gpus, ray.training_workers; ray.env_actor_cpus / --env-actor-cpus, "
        "ray.env_actor_memory_mb, ray.env_actors / --env-actors"
    ]
    assert "\x1b[" not in err and "Traceback" not in err
    ray_cpus_free()
