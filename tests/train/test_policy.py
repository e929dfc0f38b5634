"""Where the policy lives and in what precision (rollforge.train.policy): float32 master weights
and AdamW state, bfloat16 compute under autocast, frozen weights in the compute precision."""

from __future__ import annotations

import torch

from rollforge.train.config import load_config
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.policy import compute_dtype, load_policy, make_optimizer, make_reference
from rollforge.train.update import TrainedPolicy, UpdateRow, UpdateSettings, policy_update


def _config(tiny_model_dir, *overrides):
    return load_config(overrides=[f"model.name={tiny_model_dir}", "model.device=cpu", *overrides])


def _episodes():
    ids = torch.arange(5, 17)
    mask = torch.tensor([0.0] * 6 + [1.0] * 6)
    return [UpdateRow(ids, mask, torch.full((12,), -1.0) * mask, prompt_length=6) for _ in range(2)]


def test_bfloat16_computes_in_bfloat16_but_keeps_float32_master_weights_and_adam_state(tiny_model_dir):
    config = _config(tiny_model_dir, "model.dtype=bfloat16", "algorithm.kl_beta=0.1")
    assert compute_dtype(config.model) == torch.bfloat16
    model, _ = load_policy(config.model, config.lora)
    assert {(p.dtype, p.device, p.requires_grad) for p in model.parameters()} == {
        (torch.float32, torch.device("cpu"), True)
    }
    reference = make_reference(model, config.model, config.algorithm.kl_beta, config.lora.enabled)
    assert {p.dtype for p in reference.model.parameters()} == {torch.bfloat16}  # frozen: compute precision
    assert not any(p.requires_grad for p in reference.model.parameters())
    optimizer, _ = make_optimizer(model, config.optim, config.steps)
    seen = []  # dtypes of the first projection's outputs during the update
    hook = model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    episodes = _episodes()
    stats = policy_update(
        TrainedPolicy(model, optimizer, reference=reference),
        episodes,
        torch.tensor([1.0, -1.0]),
        TokenMean().weights([e.mask for e in episodes]),
        ClippedPolicyLoss(kl_beta=0.1),
        UpdateSettings(micro_batch_tokens=1000, pad_id=0, compute_dtype=compute_dtype(config.model)),
    )
    hook.remove()
    assert seen == [torch.bfloat16]  # one forward pass of the policy, under autocast
    assert isinstance(stats.loss, float) and stats.policy_tokens == 12 and stats.grad_norm > 0
    states = [optimizer.state[p] for p in model.parameters()]
    assert {s["exp_avg"].dtype for s in states} == {s["exp_avg_sq"].dtype for s in states} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_float32_computes_in_float32(tiny_model_dir):
    config = _config(tiny_model_dir)  # dtype auto on cpu
    assert compute_dtype(config.model) == torch.float32
    model, _ = load_policy(config.model, config.lora)
    seen = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    episodes = _episodes()
    policy_update(
        TrainedPolicy(model, torch.optim.SGD(model.parameters(), lr=0.0)),
        episodes,
        torch.tensor([1.0, -1.0]),
        TokenMean().weights([e.mask for e in episodes]),
        ClippedPolicyLoss(),
        UpdateSettings(micro_batch_tokens=1000, pad_id=0, compute_dtype=compute_dtype(config.model)),
    )
    assert seen == [torch.float32]


def test_lora_keeps_the_frozen_base_in_bfloat16_and_the_adapter_in_float32(tiny_model_dir):
    config = _config(tiny_model_dir, "model.dtype=bfloat16", "lora.enabled=true", "lora.r=2")
    model, _ = load_policy(config.model, config.lora)
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}
