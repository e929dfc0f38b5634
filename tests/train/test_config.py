"""The training config: closed, typed, documented, loaded from YAML with CLI overrides."""

from pathlib import Path

import pytest
import torch
import yaml

from rollforge.errors import ConfigError
from rollforge.train.config import TrainConfig, load_config
from rollforge.train.config_files import describe_config

EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.yaml") if not p.name.startswith("sft_"))


def test_overrides_reach_nested_sections_and_parse_yaml_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 5\nalgorithm:\n  batch_size: 2\n")
    c = load_config(path, ["algorithm.group_size=6", "rollout.max_turns=3", "optim.betas=[0.8, 0.9]"])
    assert (c.steps, c.algorithm.batch_size, c.algorithm.group_size, c.rollout.max_turns) == (5, 2, 6, 3)
    assert c.optim.betas == (0.8, 0.9)


def test_a_misspelled_key_names_the_nearest_valid_one():
    with pytest.raises(ConfigError, match=r"'algorithm.batchsize'; did you mean 'algorithm.batch_size'"):
        load_config(overrides=["algorithm.batchsize=4"])
    with pytest.raises(ConfigError, match=r"'rollout.max_turn'; did you mean 'rollout.max_turns'"):
        load_config(overrides=["rollout.max_turn=4"])
    with pytest.raises(ConfigError, match=r"'environments.wieght'; did you mean 'environments.weight'"):
        load_config(overrides=["environments=[{name: arithmetic, wieght: 2}]"])


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match=r"algorithm.group_size.*got 1"):
        load_config(overrides=["algorithm.group_size=1"])
    with pytest.raises(ConfigError, match=r"algorithm.advantage.*'ppo'"):
        load_config(overrides=["algorithm.advantage=ppo"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(overrides=["steps"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("missing.yaml")


def test_every_key_is_documented():
    text = describe_config(TrainConfig)
    for key in ("algorithm.kl_beta", "optim.micro_batch_tokens", "lora.r", "rollout.max_turns", "data.path"):
        assert key in text
    undocumented = [line for line in text.splitlines() if "=" in line and "#" not in line]
    assert undocumented == []


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_configs_load(path):
    assert load_config(path).steps >= 1


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_configs_train_one_step(path, tiny_model_dir, tmp_path, monkeypatch):
    """Every example runs (tiny model, one small step): environments, data files and reward
    functions named in it resolve, from the repository root as the examples say."""
    from rollforge.recipes.launch import train

    monkeypatch.chdir(Path(__file__).parents[2])
    config = load_config(
        path,
        [
            f"model.name={tiny_model_dir}",
            f"out={tmp_path}",
            "steps=1",
            "data.size=16",
            "algorithm.batch_size=4",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=4",
            "rollout.max_turns=2",
            "rollout.max_seq_len=1024",  # the tiny model's positions (an example may set more, for SmolLM2's 8192)
            "checkpoint_every=0",
        ],
    )
    result = train(config, console=False)
    assert result.history[0]["rollout/error_rate"] == 0
    if config.rewards:
        assert any(k.startswith("reward/fn/") for k in result.history[0])


def test_yaml_mistakes_name_the_file_line_and_column(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 3\nalgorithm:\n\tbatch_size: 4\n")
    with pytest.raises(
        ConfigError,
        match=r"c.yaml' is not valid YAML: found character '\\t' that cannot start any token at line 3, column 1",
    ):
        load_config(path)
    with pytest.raises(
        ConfigError, match=r"override 'algorithm.batch_size=\{4': the value is not valid YAML: .* at line 1, column 3"
    ):
        load_config(overrides=["algorithm.batch_size={4"])


def test_device_and_dtype_default_to_auto_and_bad_devices_are_named():
    c = load_config()
    assert (c.model.device, c.model.dtype) == ("auto", "auto")
    assert load_config(overrides=["model.device=CUDA:1"]).model.device == "cuda:1"
    with pytest.raises(
        ConfigError,
        match=r"^invalid training config: model.device: .*unknown device 'gpu'; expected auto, cpu, cuda or cuda:N",
    ):
        load_config(overrides=["model.device=gpu"])
    with pytest.raises(ConfigError, match=r"model.dtype: .*'float16'"):
        load_config(overrides=["model.dtype=float16"])


def test_colocated_vllm_is_checked_against_the_other_sections():
    c = load_config(overrides=["model.backend=vllm", "vllm.colocate=true", "vllm.gpu_memory_utilization=0.3"])
    assert (
        c.vllm.backend_options(torch.bfloat16)
        == c.vllm.backend_options("bfloat16")
        == {"dtype": "bfloat16", "sleep_level": 2, "gpu_memory_utilization": 0.3, "kv_cache_gib": None}
    )
    assert load_config(overrides=["model.backend=vllm"]).vllm.backend_options("float32") == {"dtype": "float32"}
    cases = {
        ("vllm.colocate=true",): "vllm.colocate needs model.backend 'vllm', got 'hf'",
        ("vllm.colocate=true", "model.backend=vllm", "model.device=cpu"): "model.device is 'cpu'",
        (
            "vllm.colocate=true",
            "model.backend=vllm",
            "model.device=cuda:1",
        ): "first visible GPU, but model.device is 'cuda:1'",
        ("vllm.colocate=true", "model.backend=vllm", "lora.enabled=true"): "use vllm.sleep_level 1",
        ("vllm.gpu_memory_utilization=0",): r"vllm.gpu_memory_utilization: Input should be greater than 0",
        ("vllm.gpu_memory_utilization=1.5",): r"vllm.gpu_memory_utilization: Input should be less than or equal to 1",
        ("vllm.sleep_level=3",): r"vllm.sleep_level: ",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message) as error:
            load_config(overrides=list(overrides))
        assert "\n" not in str(error.value)
    lora = load_config(
        overrides=["vllm.colocate=true", "model.backend=vllm", "lora.enabled=true", "vllm.sleep_level=1"]
    )
    assert lora.vllm.backend_options("float32")["sleep_level"] == 1


def test_ray_keys_need_executor_ray_but_a_local_runs_saved_config_loads_again(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=["ray.generation_replicas=2"])
    assert str(caught.value) == (
        "invalid training config: ray.generation_replicas=2 needs executor: ray "
        "(or --executor ray); with executor 'local' nothing runs on Ray"
    )
    with pytest.raises(ConfigError, match=r"ray.address='auto' needs executor: ray"):
        load_config(overrides=["executor=local", "ray.address=auto", "ray.env_actors=3"])
    assert load_config(overrides=["executor=ray", "ray.generation_replicas=2"]).ray.generation_replicas == 2
    saved = tmp_path / "config.yaml"  # as train/preflight.py writes it: every key, the ray section's at its defaults
    saved.write_text(yaml.safe_dump(load_config(overrides=["steps=3"]).model_dump(mode="json")))
    assert load_config(saved).steps == 3


def test_eval_every_needs_held_out_episodes():
    with pytest.raises(ConfigError) as caught:
        load_config(overrides=["eval_every=2"])
    assert str(caught.value) == (
        "invalid training config: eval_every=2 needs eval_episodes > 0: the held-out episodes it evaluates"
    )
    assert load_config(overrides=["eval_every=2", "eval_episodes=8"]).eval_every == 2
