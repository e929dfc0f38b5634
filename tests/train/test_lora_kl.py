"""LoRA through peft (adapter-only updates, adapter checkpoints, resume) and the KL term."""

import pytest
import torch
from safetensors.torch import load_file

from rollforge.models import load_model
from rollforge.recipes.launch import train
from rollforge.train import checkpoint as ckpt
from rollforge.inputs.rewards import RewardFunction

pytest.importorskip("peft")


def first_code(prompts, completions, **_):
    """A dense reward (the first character's code point), so every group has variance."""
    return [ord((c[-1]["content"] if c else " ")[:1] or " ") / 100 for c in completions]


DENSE = [RewardFunction("first_code", first_code)]


def test_lora_trains_only_the_adapter_and_checkpoints_it(tiny_config, tiny_model_dir):
    config = tiny_config(
        "steps=3", "lora.enabled=true", "lora.r=4", "optim.lr=1e-2", "algorithm.kl_beta=0.1", "checkpoint_every=1"
    )
    result = train(config, reward_functions=DENSE, console=False)
    kls = [m["kl"] for m in result.history]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # the first update starts at the reference
    assert kls[-1] > 0  # after updates the adapter moved the policy away from the base model
    latest = ckpt.latest_checkpoint(result.out / "checkpoints")
    adapter = load_file(latest / "model" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert not (latest / "model" / "model.safetensors").exists()  # base weights are not copied
    assert any(float(t.abs().sum()) > 0 for k, t in adapter.items() if "lora_B" in k)  # B starts at 0
    resumed = train(
        tiny_config(
            "steps=4", "lora.enabled=true", "lora.r=4", "optim.lr=1e-2", "algorithm.kl_beta=0.1", "checkpoint_every=1"
        ),
        resume=True,
        reward_functions=DENSE,
        console=False,
    )
    assert [m["step"] for m in resumed.history] == [1, 2, 3, 4]
    assert resumed.history[3]["kl"] > 0


def test_full_fine_tuning_with_kl_uses_a_frozen_reference(tiny_config, tiny_model_dir):
    result = train(
        tiny_config("steps=2", "algorithm.kl_beta=0.5", "optim.lr=1e-2"), reward_functions=DENSE, console=False
    )
    assert result.history[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert result.history[1]["kl"] > 0
    trained = load_file(ckpt.latest_checkpoint(result.out / "checkpoints") / "model" / "model.safetensors")
    initial, _ = load_model(tiny_model_dir)
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(trained[name], initial.state_dict()[name])


def test_bfloat16_training_runs_with_ratios_near_one(tiny_config):
    result = train(tiny_config("steps=1", "model.dtype=bfloat16"), reward_functions=DENSE, console=False)
    step = result.history[0]
    assert step["policy_tokens"] > 0 and step["grad_norm"] > 0
    assert step["mean_ratio"] == pytest.approx(1.0, abs=0.05)  # bf16 trainer vs bf16 engine numerics
