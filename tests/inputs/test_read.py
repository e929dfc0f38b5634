"""``read_inputs``: the one function that turns the environments and the prompts into
(``task_to_env``, samples), for training's sections and ``rollforge rollout``'s flags alike."""

import json

import pytest

import rollforge.inputs.read as read
from rollforge.cli.rollout import environments_and_prompts
from rollforge.errors import ConfigError
from rollforge.inputs.config import EnvConfig
from rollforge.inputs.data import even_counts, generated_samples, weighted_counts
from rollforge.inputs.read import Prompts, held_out, read_inputs, read_samples, training_prompts
from rollforge.train.config import TrainConfig


def test_the_generators_share_by_weight_for_training_and_evenly_for_the_command():
    envs = [EnvConfig(name="arithmetic", weight=3), EnvConfig(name="guess_number")]
    assert weighted_counts(envs, 8) == [6, 2]  # 8 * 3/4, 8 * 1/4
    assert weighted_counts(envs, 1) == [1, 1]  # each at least one
    assert even_counts([*envs, EnvConfig(name="arithmetic")], 7) == [3, 2, 2]  # the first gets the remainder
    task_to_env, samples = read_inputs(envs, Prompts(generated=8, seed=5))
    assert list(task_to_env) == ["arithmetic", "guess_number"]
    assert samples == generated_samples(envs, 8, 5)
    tasks = [s.task_name for s in samples]
    assert tasks == ["arithmetic", "arithmetic", "guess_number", "arithmetic"] * 2  # in proportion, 3:1
    three = [EnvConfig(name="calculator", weight=2), EnvConfig(name="arithmetic"), EnvConfig(name="guess_number")]
    tasks = [s.task_name for s in generated_samples(three, 12, 0)]
    assert tasks == ["calculator", "arithmetic", "guess_number", "calculator"] * 3  # 2:1:1 in every run of four
    equal = [EnvConfig(name="calculator"), EnvConfig(name="arithmetic")]
    assert [s.task_name for s in generated_samples(equal, 6, 0)] == ["calculator", "arithmetic"] * 3


def test_training_and_the_rollout_command_read_a_data_file_the_same_way(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in "abc"))
    reads = []
    load_rows = read.load_rows
    monkeypatch.setattr(read, "load_rows", lambda p: reads.append(p) or load_rows(p))
    config = TrainConfig.model_validate(
        {"model": {"name": "m"}, "environments": [{"name": "arithmetic"}], "data": {"path": str(path)}}
    )
    task_to_env, samples = read_inputs(config.environments, training_prompts(config.data, config.seed))
    assert reads == [str(path)] and list(task_to_env) == ["arithmetic"]  # the file read once
    assert [s.prompt[-1].content for s in samples] == ["a", "b", "c"]
    command, _ = environments_and_prompts(["arithmetic"], path, 5, 0)
    assert command[:3] == samples and [s.prompt[-1].content for s in command[3:]] == ["a", "b"]  # cycled


def test_held_out_prompts_come_from_the_same_sources():
    config = TrainConfig.model_validate(
        {"model": {"name": "m"}, "environments": [{"name": "arithmetic"}], "eval_episodes": 3, "seed": 4}
    )
    prompts = held_out(training_prompts(config.data, config.seed), config.eval_episodes)
    samples = read_samples(config.environments, prompts, ["arithmetic"])
    assert len(samples) == 3 and samples != generated_samples(config.environments, 3, 4)  # another seed
    rows = held_out(training_prompts(config.data, config.seed, [{"prompt": p} for p in "abcd"]), 3)
    assert [s.prompt[-1].content for s in read_samples(config.environments, rows, ["arithmetic"])] == ["a", "b", "c"]
    two = [EnvConfig(name="arithmetic"), EnvConfig(name="guess_number")]
    assert weighted_counts(two, 3) == [2, 2]  # round(1.5) each: 4 generated, the first 3 held out
    assert len(read_samples(two, held_out(Prompts(seed=4), 3), ["arithmetic", "guess_number"])) == 3


def test_refusals_name_the_setting_the_user_wrote(tmp_path):
    # an environment without a generator is refused before any environment is built or imported
    with pytest.raises(
        ConfigError, match=r"^environment 'nomod:X' has no prompt generator; give prompts with data.path$"
    ):
        read_inputs([EnvConfig(name="nomod:X")], Prompts())
    with pytest.raises(
        ConfigError, match=r"^--env 'nomod:X' has no prompt generator; give prompts with --data FILE.jsonl$"
    ):
        environments_and_prompts(["nomod:X"], None, 3, 0)
    with pytest.raises(ConfigError, match="have no prompt generator: pass dataset= or set data.path"):
        read_inputs([], Prompts(), {"Mine": lambda: None})
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"^--data '.*e.jsonl' holds no rows$"):
        environments_and_prompts(["arithmetic"], empty, None, 0)
    with pytest.raises(ConfigError, match="names no configured environment"):
        read_inputs([EnvConfig(name="arithmetic")], Prompts(rows=[{"prompt": "a", "environment": "guess_number"}]))
