"""backend_config: the trainer's backend from the model, rollout and ray sections."""

from __future__ import annotations

import pytest
import torch

from rollforge.backends.config import BackendConfig
from rollforge.cluster.config import RayConfig
from rollforge.errors import ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.train.config import ModelConfig
from rollforge.train.generation_backend import backend_config, shared_model

ROLLOUT = RolloutConfig(concurrency=12)
RAY = RayConfig(generation_replicas=3, replica_cpus=0.5, replica_gpus=1.0)


def test_a_local_hf_run_shares_the_trained_model():
    config = backend_config(ModelConfig(name="m"), ROLLOUT, RAY, "local", 7, lora_enabled=True)
    assert config == BackendConfig(
        kind="hf",
        model="m",
        concurrency=12,
        seed=7,
        replica_cpus=0.5,
        replica_gpus=1.0,
        options={"compute_dtype": torch.float32},
    )  # CPU: float32 compute
    model = object()
    assert shared_model(config, model) is model


def test_generation_dtype_sets_the_backends_precision_apart_from_the_updates():
    both = ModelConfig(name="m", dtype="bfloat16")
    assert backend_config(both, ROLLOUT, RAY, "local", 0, False).options == {"compute_dtype": torch.bfloat16}
    apart = ModelConfig(name="m", dtype="bfloat16", generation_dtype="float32")
    assert backend_config(apart, ROLLOUT, RAY, "local", 0, False).options == {"compute_dtype": torch.float32}
    vllm = ModelConfig(name="m", backend="vllm", generation_dtype="bfloat16")
    assert backend_config(vllm, ROLLOUT, RAY, "local", 0, False).options["dtype"] == "bfloat16"


def test_vllm_with_lora_loads_adapters_and_ray_runs_the_replicas():
    vllm = ModelConfig(name="m", backend="vllm", device="cpu")
    assert backend_config(vllm, ROLLOUT, RAY, "local", 0, lora_enabled=True).options == {
        "dtype": "float32",
        "enable_lora": True,
    }
    assert backend_config(vllm, ROLLOUT, RAY, "local", 0, lora_enabled=False).options == {"dtype": "float32"}
    on_ray = backend_config(vllm, ROLLOUT, RAY, "ray", 0, lora_enabled=False)
    assert (on_ray.replicas, on_ray.replica_cpus, on_ray.replica_gpus) == (3, 0.5, 1.0)
    assert shared_model(on_ray, object()) is None  # each actor loads its own copy


def test_openai_takes_its_servers_and_their_count_is_checked():
    served = ModelConfig(name="m", backend="openai", base_url="http://a:1,http://b:2", served_model_name="s")
    config = backend_config(served, ROLLOUT, RayConfig(generation_replicas=2), "ray", 1, lora_enabled=False)
    assert (config.urls, config.served_model_name, config.replicas, config.options) == (
        ["http://a:1", "http://b:2"],
        "s",
        2,
        {},
    )
    with pytest.raises(ConfigError, match=r"one replica per URL: replicas=3 but base_url names 2 server\(s\)"):
        backend_config(served, ROLLOUT, RAY, "ray", 1, lora_enabled=False)
