"""Environment names in a training config: bundled, families, OpenEnv URLs, modules and files."""

import pytest

from rollforge.envs.factory import FactoryEnvironment
from rollforge.envs.stepwise import StepwiseEnvironment
from rollforge.errors import ConfigError
from rollforge.train.config import EnvConfig
from rollforge.train.environments import build_environments


def test_each_kind_of_name_builds_the_right_environment(tmp_path):
    (tmp_path / "my_env.py").write_text(
        "class Tools:\n    def reset(self, **row):\n        return None\n\n"
        "class Judge:\n    def step(self, message_logs, metadata):\n        raise NotImplementedError\n"
    )
    envs = build_environments([
        EnvConfig(name="arithmetic"),
        EnvConfig(name="http://127.0.0.1:8765", task_name="remote"),
        EnvConfig(name=f"{tmp_path / 'my_env.py'}:Tools"),
        EnvConfig(name=f"{tmp_path / 'my_env.py'}:Judge", task_name="judge"),
        EnvConfig(name="rollforge.testing:FirstCharacter"),
    ])
    assert list(envs) == ["arithmetic", "remote", "Tools", "judge", "FirstCharacter"]
    assert type(envs["remote"]).__name__ == "OpenEnvEnvironment"
    assert isinstance(envs["Tools"], FactoryEnvironment)
    assert isinstance(envs["judge"], StepwiseEnvironment) and isinstance(envs["FirstCharacter"], StepwiseEnvironment)


def test_bad_names_are_explained():
    with pytest.raises(ConfigError, match="unknown environment 'arithmetik'"):
        build_environments([EnvConfig(name="arithmetik")])
    with pytest.raises(ConfigError, match="two environments have the task name 'arithmetic'"):
        build_environments([EnvConfig(name="arithmetic"), EnvConfig(name="arithmetic")])
    with pytest.raises(ConfigError, match="has no attribute 'Nope'"):
        build_environments([EnvConfig(name="rollforge.testing:Nope")])
    with pytest.raises(ConfigError, match="no environments configured"):
        build_environments([])
