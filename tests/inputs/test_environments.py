"""Environment names in a training config (bundled, families, OpenEnv URLs, modules and files) and
environment objects given to ``train()``."""

import pytest

from rollforge.envs.factory import FactoryEnvironment
from rollforge.envs.stepwise import StepwiseEnvironment
from rollforge.errors import ConfigError
from rollforge.inputs.config import EnvConfig
from rollforge.inputs.data import rows_to_samples
from rollforge.inputs.environments import build_environments, check_routes, import_attribute
from rollforge.recipes.launch import train
from rollforge.train.config import TrainConfig
from rollforge.train.run_setup import given_environments


def test_each_kind_of_name_builds_the_right_environment(tmp_path):
    (tmp_path / "my_env.py").write_text(
        "class Tools:\n    def reset(self, **row):\n        return None\n\n"
        "class Judge:\n    def step(self, message_logs, metadata):\n        raise NotImplementedError\n"
    )
    envs = build_environments(
        [
            EnvConfig(name="arithmetic"),
            EnvConfig(name="http://127.0.0.1:8765", task_name="remote"),
            EnvConfig(name=f"{tmp_path / 'my_env.py'}:Tools"),
            EnvConfig(name=f"{tmp_path / 'my_env.py'}:Judge", task_name="judge"),
            EnvConfig(name="rollforge.testing:FirstCharacter"),
        ]
    )
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


# --- TRL-style use: files imported once, objects given to train(), environment columns checked ---

ENV_FILE = '''
class Counter:
    """Counts what it is told."""

    def reset(self, **row):
        self.total = 0
        return None

    def add(self, n: int) -> str:
        """Add to the total.

        Args:
            n: how much to add
        """
        self.total += n
        return str(self.total)

    def get_reward(self) -> float:
        return 0.0
'''

REWARD_FILE = """
from trl_counting_env import Counter


def is_counter(prompts, completions, environments, **columns):
    return [1.0 if isinstance(env, Counter) else -1.0 for env in environments]
"""


def test_a_file_is_imported_once_under_its_own_name(tmp_path):
    (tmp_path / "counting_env.py").write_text(ENV_FILE)
    first = import_attribute(f"{tmp_path / 'counting_env.py'}:Counter")
    again = import_attribute(f"{tmp_path}/./counting_env.py:Counter")
    import counting_env  # the folder of a named file is importable, as for `python file.py`

    assert first is again is counting_env.Counter
    (tmp_path / "my-env.py").write_text(ENV_FILE)  # not an identifier: a private module name, still once
    private = import_attribute(f"{tmp_path / 'my-env.py'}:Counter")
    assert private is import_attribute(f"{tmp_path / 'my-env.py'}:Counter") and private is not first
    other = tmp_path / "other"
    other.mkdir()
    (other / "counting_env.py").write_text(ENV_FILE)  # same file name elsewhere: its own module
    assert import_attribute(f"{other / 'counting_env.py'}:Counter") is not first
    assert import_attribute(f"{tmp_path / 'counting_env.py'}:Counter") is first


def _trl_config(tiny_config, *overrides):
    """The tiny config without its explicit ``environments``: the objects given replace the default."""
    return TrainConfig.model_validate(tiny_config(*overrides).model_dump(exclude={"environments"}))


def _rows(n, **columns):
    return [{"prompt": f"Count to {i}.", **columns} for i in range(n)]


def test_train_takes_environment_objects_and_reward_code_sees_the_same_class(tiny_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trl_counting_env.py").write_text(ENV_FILE)
    (tmp_path / "counting_rewards.py").write_text(REWARD_FILE)
    counter = import_attribute("trl_counting_env.py:Counter")  # as a training config names it
    config = _trl_config(
        tiny_config, "steps=1", "algorithm.group_size=2", "rewards=[{function: 'counting_rewards.py:is_counter'}]"
    )
    result = train(config, environments={"count": counter}, dataset=_rows(8), console=False)
    assert result.history[0]["reward/fn/is_counter"] == 1.0  # isinstance held for every episode
    assert result.history[0]["reward/env/count"] == 1.0  # env reward 0 + the function's 1.0
    single = train(
        config.model_copy(update={"out": str(tmp_path / "single")}),
        environments=counter,
        dataset=_rows(8),
        console=False,
    )
    assert "reward/env/Counter" in single.history[0]  # one object is named after itself


def test_train_refuses_an_environment_column_without_a_factory_before_generating(tiny_config, tmp_path):
    (tmp_path / "counting_env.py").write_text(ENV_FILE)
    counter = import_attribute(f"{tmp_path / 'counting_env.py'}:Counter")
    config = _trl_config(tiny_config, "steps=1", f"out={tmp_path / 'never'}")
    rows = _rows(3, environment="a") + _rows(1, environment="c")
    with pytest.raises(
        ConfigError,
        match=r"prompt row 4 has the value 'c' in its 'environment' column, but "
        r"'multi' has factories only for \['a', 'b'\]",
    ):
        train(config, environments={"multi": {"a": counter, "b": counter}}, dataset=rows, console=False)
    with pytest.raises(ConfigError, match="prompt row 1 has no 'environment' column"):
        train(config, environments={"multi": {"a": counter}}, dataset=_rows(2), console=False)
    with pytest.raises(
        ConfigError, match=r"prompt row 2: environment 'c' names no configured environment \(configured: \['count'\]\)"
    ):
        train(config, environments={"count": counter}, dataset=[*_rows(1), *_rows(1, environment="c")], console=False)
    with pytest.raises(ConfigError, match="have no prompt generator: pass dataset= or set data.path"):
        train(
            config.model_copy(update={"data": config.data.model_copy(update={"path": None})}),
            environments={"count": counter},
            console=False,
        )
    assert not (tmp_path / "never").exists()  # refused before anything was written or generated


def test_given_objects_replace_the_default_environments_only():
    """``open_run`` and ``train()``'s count of pooled environments apply one rule (``given_environments``)."""
    default = TrainConfig()  # arithmetic, by default
    config, given = given_environments(default, {"count": dict})
    assert config.environments == [] and given == {"count": dict}
    explicit = TrainConfig(environments=[EnvConfig(name="arithmetic")])
    config, given = given_environments(explicit, dict)
    assert [e.name for e in config.environments] == ["arithmetic"] and given == {"dict": dict}  # named after itself
    assert given_environments(default, None) == (default, {})


def test_check_routes_accepts_what_routes():
    counter = FactoryEnvironment({"a": dict, "b": dict})
    samples = rows_to_samples(_rows(2, environment="b"), ["multi"])
    check_routes(samples, {"multi": counter})
    assert [s.task_name for s in rows_to_samples(_rows(2, environment="x"), ["x", "y"])] == ["x", "x"]
