"""Config mistakes reach the user as one line naming the key, the value and what was expected:
``RolloutConfig``'s timeouts, training and SFT configs through ``describe_validation_error``,
``rollforge rollout``'s Ray-only flags, and ``rollforge train``'s ``--ray-address`` and ``ray`` keys
without ``executor: ray``."""

from __future__ import annotations

import pytest

from rollforge.cli.main import main
from rollforge.errors import ConfigError
from rollforge.recipes.sft_config import load_sft_config
from rollforge.rollout.config import RolloutConfig
from rollforge.train.config import load_config


def one_line_error(capsys, *argv) -> str:
    capsys.readouterr()
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("rollforge: error: ").strip()


@pytest.fixture
def stop_at_model_loading(monkeypatch):
    """``rollforge rollout`` stops where it would load the model: every check before it passed."""

    def stop(name):
        raise ConfigError("stopped before loading the model")

    monkeypatch.setattr("rollforge.models.load_tokenizer", stop)


def test_a_short_episode_timeout_lowers_the_default_step_timeout():
    assert RolloutConfig.build(episode_timeout=30).step_timeout == 30
    assert RolloutConfig.build(episode_timeout=90).step_timeout == 60.0  # the default already fits
    assert RolloutConfig.build(episode_timeout=None).step_timeout == 60.0
    assert load_config(overrides=["rollout.episode_timeout=30"]).rollout.step_timeout == 30


def test_a_step_timeout_given_above_the_episode_timeout_is_one_line_naming_both():
    with pytest.raises(ConfigError) as caught:
        RolloutConfig.build(episode_timeout=30, step_timeout=40)
    assert str(caught.value) == (
        "invalid rollout config: step_timeout (40.0) is larger than episode_timeout (30.0); "
        "expected step_timeout <= episode_timeout"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=["rollout.episode_timeout=30", "rollout.step_timeout=40"])
    assert str(caught.value) == (
        "invalid training config: rollout: step_timeout (40.0) is larger than episode_timeout (30.0); "
        "expected step_timeout <= episode_timeout"
    )


def test_rollout_with_only_an_episode_timeout_starts(stop_at_model_loading, tmp_path, capsys):
    err = one_line_error(capsys, "rollout", "--out", str(tmp_path / "out"), "--episode-timeout", "30")
    assert err == "stopped before loading the model"


def test_each_invalid_training_value_is_named_with_its_value_and_what_was_expected():
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=["seed=x", "optim.lr=-1", "rollout.max_turns=0"])
    assert str(caught.value) == (
        "invalid training config: "
        "seed: Input should be a valid integer, unable to parse string as an integer (got 'x'); "
        "optim.lr: Input should be greater than 0 (got -1); "
        "rollout.max_turns: Input should be greater than or equal to 1 (got 0)"
    )


def test_sft_source_errors_name_the_item_as_the_user_writes_it():
    with pytest.raises(ConfigError) as caught:
        load_sft_config(overrides=["sources=[{kind: expert, env: echo, episodes: 0}, {kind: trajectories}]"])
    assert str(caught.value) == (
        "invalid sft config: sources[0].episodes: Input should be greater than or equal to 1 (got 0); "
        "sources[1].path: required, but not given"
    )


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--env-actors", "4"),
        ("--env-actor-cpus", "0.5"),
        ("--ray-address", "auto"),
        ("--replicas", "2"),
        ("--replica-cpus", "1"),
    ],
)
def test_a_ray_only_flag_without_executor_ray_is_one_line(flag, value, stop_at_model_loading, tmp_path, capsys):
    err = one_line_error(capsys, "rollout", "--out", str(tmp_path / "out"), flag, value)
    shown = float(value) if flag.endswith("cpus") else int(value) if value.isdigit() else value
    assert err == f"{flag} {shown} needs --executor ray (it sets how environments or replicas run on Ray actors)"
    assert not (tmp_path / "out").exists()


def test_ray_only_flags_are_accepted_with_executor_ray(stop_at_model_loading, tmp_path, capsys):
    err = one_line_error(capsys, "rollout", "--out", str(tmp_path / "out"), "--executor", "ray", "--env-actors", "4")
    assert err == "stopped before loading the model"


@pytest.fixture
def stop_at_training(monkeypatch):
    """``rollforge train`` stops where it would start training: the config passed every check."""

    def stop(config, **kwargs):
        raise ConfigError(f"stopped before training (executor {config.executor}, ray.address {config.ray.address})")

    monkeypatch.setattr("rollforge.recipes.launch.train", stop)


def test_train_ray_address_needs_executor_ray_from_the_flag_or_the_config(stop_at_training, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("steps: 1\n")
    err = one_line_error(capsys, "train", str(config), "--ray-address", "auto")
    assert err == "--ray-address auto needs --executor ray (it sets how environments or replicas run on Ray actors)"
    err = one_line_error(capsys, "train", str(config), "--ray-address", "auto", "--executor", "ray")
    assert err == "stopped before training (executor ray, ray.address auto)"
    config.write_text("steps: 1\nexecutor: ray\n")
    err = one_line_error(capsys, "train", str(config), "--ray-address", "auto")
    assert err == "stopped before training (executor ray, ray.address auto)"
    err = one_line_error(capsys, "train", str(config), "--ray-address", "auto", "--executor", "local")
    assert err.startswith("--ray-address auto needs --executor ray")


def test_train_ray_keys_under_executor_local_are_one_line(stop_at_training, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("steps: 1\nray:\n  env_actors: 4\n")
    err = one_line_error(capsys, "train", str(config))
    assert err == (
        "invalid training config: ray.env_actors=4 needs executor: ray (or --executor ray); "
        "with executor 'local' nothing runs on Ray"
    )
    assert one_line_error(capsys, "train", str(config), "--executor", "ray").startswith("stopped before training")
