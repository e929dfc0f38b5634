"""The update step on the tiny model: logprobs agree with generation, micro-batching does not
change the gradient, and only policy tokens move the loss."""

import pytest
import torch

from rollforge import ChatRenderer, HFBackend, RolloutConfig, rollout
from rollforge.envs.library import get_env_spec
from rollforge.models import load_model
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.micro_batches import pack_micro_batches
from rollforge.train.logprobs import sequence_logprobs
from rollforge.train.update import (
    Reference,
    TrainedPolicy,
    UpdateRow,
    UpdateSettings,
    policy_update,
    sequences,
)


@pytest.fixture(scope="module")
def rolled(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    spec = get_env_spec("guess_number")
    backend = HFBackend(model, tokenizer)
    try:
        samples = [s for s in spec.samples(2, 0) for _ in range(3)]  # two groups of three
        result = rollout(
            samples,
            {"guess_number": spec.build()},
            backend,
            ChatRenderer(tokenizer),
            RolloutConfig(max_turns=3, max_new_tokens=6, seed=1),
        )
    finally:
        import asyncio

        asyncio.run(backend.close())
    return model, tokenizer, result.trajectories


def test_trainer_logprobs_match_the_generation_logprobs(rolled):
    model, tokenizer, trajectories = rolled
    assert any(t.turns > 1 for t in trajectories)  # multi-turn: env tokens sit between policy tokens
    for e in sequences(trajectories)[0]:
        with torch.no_grad():
            lp = sequence_logprobs(model, e.ids[None], torch.ones_like(e.ids)[None], e.mask[None] > 0)[0]
        assert torch.allclose(lp[e.mask > 0], e.old_logprobs[e.mask > 0], atol=1e-4)
        assert lp[e.mask == 0].abs().sum() == 0


def test_packing_respects_the_token_budget():
    batches = pack_micro_batches([10, 50, 20, 30, 5], micro_batch_tokens=60)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    lengths = [10, 50, 20, 30, 5]
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 60 or len(b) == 1
    assert pack_micro_batches([100], 10) == [[0]]  # an over-long episode still trains, alone


def test_micro_batching_and_shared_prompts_give_the_full_batch_gradient(rolled):
    model, tokenizer, trajectories = rolled
    episodes, owners = sequences(trajectories)
    assert owners == list(range(len(trajectories)))  # one segment each: nothing changes
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.linspace(-1, 1, len(episodes))
    grads, results = [], []
    # (group_size, budget): one padded batch; one episode per pass; groups sharing their prompt;
    # groups split into single rows (each still sharing nothing but its own prompt pass)
    for group_size, budget in ((1, 100_000), (1, 1), (3, 100_000), (3, 1)):
        captured = []

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                captured.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)

        stats = policy_update(
            TrainedPolicy(model, Capture(model.parameters(), lr=0.0)),
            episodes,
            advantages,
            weights,
            ClippedPolicyLoss(),
            UpdateSettings(micro_batch_tokens=budget, pad_id=tokenizer.pad_token_id),
            group_size=group_size,
        )
        grads.append(captured)
        results.append(stats)
    assert [r.micro_batches for r in results] == [1, 6, 2, 6]
    for stats in results[1:]:
        assert stats.loss == pytest.approx(results[0].loss, abs=1e-6)
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.allclose(a, b, atol=1e-5)
    prompt = episodes[0].prompt_length
    total = sum(e.ids.numel() for e in episodes)
    assert results[2].tokens == total - 2 * 2 * prompt  # each group's prompt forwarded once, not 3 times
    assert results[0].mean_ratio == pytest.approx(1.0, abs=1e-4)  # on-policy: ratio 1
    assert results[0].policy_tokens == sum(int(e.mask.sum()) for e in episodes)


def test_a_head_over_its_logit_budget_runs_in_chunks_with_the_same_loss_and_gradient(rolled, monkeypatch):
    # On an H100 a 16k-token pack of Qwen3-0.6B ran out of memory at the (16384 x 151936) float32
    # logits: above LOGIT_BUDGET the head and the log-softmax run chunk by chunk.
    from rollforge.train import logprobs

    model, tokenizer, trajectories = rolled
    episodes, _ = sequences(trajectories)
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.linspace(-1, 1, len(episodes))
    vocab = model.get_output_embeddings().weight.shape[0]
    seen, results = [], []
    original = logprobs._head_and_logprobs
    monkeypatch.setattr(
        logprobs, "_head_and_logprobs", lambda head, h, p: seen.append(h.shape[0]) or original(head, h, p)
    )
    for budget in (10**9, 5 * vocab):  # whole, then 5 tokens' logits at a time
        monkeypatch.setattr(logprobs, "LOGIT_BUDGET", budget)
        monkeypatch.setattr(logprobs, "LOGIT_CHUNK", 5 * vocab)
        seen.clear()
        captured = []

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                captured.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)

        stats = policy_update(
            TrainedPolicy(model, Capture(model.parameters(), lr=0.0)),
            episodes,
            advantages,
            weights,
            ClippedPolicyLoss(),
            UpdateSettings(micro_batch_tokens=100_000, pad_id=tokenizer.pad_token_id),
        )
        results.append((stats.loss, captured, max(seen)))
    (whole_loss, whole, widest), (loss, chunked, chunk_widest) = results
    assert widest > 5 and chunk_widest == 5
    assert loss == pytest.approx(whole_loss, abs=1e-6)
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, atol=1e-6)
    with torch.no_grad():  # scoring only (a reference model): chunks without the recompute
        e = episodes[0]
        assert torch.allclose(
            sequence_logprobs(model, e.ids[None], torch.ones_like(e.ids)[None], e.mask[None] > 0)[0],
            e.old_logprobs,
            atol=1e-4,
        )


def test_rows_packed_behind_a_shared_prompt_score_as_if_run_alone(tiny_model_dir):
    """Rows of 3, 9, 5 and 1 tokens after one 7-token prompt: run unpadded end to end behind the
    prompt, each token scores as in its own row's plain forward pass (no leak across rows)."""
    model, _ = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    prompt, lengths = torch.randint(3, 600, (7,), generator=g), [3, 9, 5, 1]
    ids = torch.zeros(4, 7 + 9, dtype=torch.long)
    attention, targets = torch.zeros_like(ids), torch.zeros(4, 16, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, :7], ids[row, 7 : 7 + n] = prompt, torch.randint(3, 600, (n,), generator=g)
        attention[row, : 7 + n], targets[row, 7 : 7 + n] = 1, True
    with torch.no_grad():
        packed = sequence_logprobs(model, ids, attention, targets, prefix=7)
        for row, n in enumerate(lengths):
            alone = sequence_logprobs(
                model, ids[row : row + 1, : 7 + n], attention[row : row + 1, : 7 + n], targets[row : row + 1, : 7 + n]
            )
            assert torch.allclose(packed[row, : 7 + n], alone[0], atol=1e-5)
    assert int((packed != 0).sum()) == sum(lengths)


# Drops every assistant message but the last one, like templates that drop past reasoning.
FORGETFUL = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}(earlier answer){% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_each_segment_is_a_sequence_the_model_saw_with_its_episodes_advantage(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    tokenizer.chat_template = FORGETFUL
    spec = get_env_spec("guess_number")
    backend = HFBackend(model, tokenizer)
    try:
        samples = list(spec.samples(2, 0))
        result = rollout(
            samples,
            {"guess_number": spec.build()},
            backend,
            ChatRenderer(tokenizer),
            RolloutConfig(max_turns=3, max_new_tokens=6, seed=1),
        )
    finally:
        import asyncio

        asyncio.run(backend.close())
    trajectories = result.trajectories
    assert any(len(t.segments) > 1 for t in trajectories)
    episodes, owners = sequences(trajectories)
    assert owners == [i for i, t in enumerate(trajectories) for _ in t.segments]
    for e, segment in zip(episodes, (s for t in trajectories for s in t.segments)):
        assert e.ids.tolist() == list(segment.token_ids) and e.prompt_length == segment.prompt_length
        with torch.no_grad():  # the trainer scores each segment exactly as the model generated it
            lp = sequence_logprobs(model, e.ids[None], torch.ones_like(e.ids)[None], e.mask[None] > 0)[0]
        assert torch.allclose(lp[e.mask > 0], e.old_logprobs[e.mask > 0], atol=1e-4)
    for t in trajectories:
        assert "(earlier answer)" not in tokenizer.decode(t.segments[0].token_ids)
        if len(t.segments) > 1:
            assert "(earlier answer)" in tokenizer.decode(t.segments[1].token_ids[: t.segments[1].prompt_length])
    advantages = torch.tensor([1.0, -1.0])[owners]  # every segment carries its episode's advantage
    assert advantages.tolist() == [1.0 if o == 0 else -1.0 for o in owners]


def _assert_inputs_on(device):
    """A forward pre-hook failing when a tensor handed to the model is not on ``device``."""

    def hook(module, args, kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                assert value.device == device, f"{module.__class__.__name__} got a tensor on {value.device}"

    return hook


def test_the_update_builds_every_tensor_on_the_models_device(tiny_model_dir):
    # No GPU here: the default device is set to "meta" while the model lives on the CPU, so any
    # tensor the update creates without naming the model's device lands on "meta" and fails the
    # hook or the arithmetic. On a GPU the same code puts them on the GPU.
    model, _ = load_model(tiny_model_dir)
    model.requires_grad_(True)
    device = next(model.parameters()).device
    handles = [
        m.register_forward_pre_hook(_assert_inputs_on(device), with_kwargs=True)
        for m in (model, model.get_decoder(), model.get_output_embeddings())
    ]
    ids = torch.arange(5, 17)
    mask = torch.tensor([0.0] * 6 + [1.0] * 6)
    episodes = [
        UpdateRow(ids, mask, -mask, prompt_length=6),
        UpdateRow(ids[:10], mask[:10], -mask[:10], prompt_length=6),
    ]
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.tensor([1.0, -1.0])
    results = []
    for group_size in (1, 2):  # packed rows, and a shared prompt computed once
        with torch.device("meta"):
            results.append(
                policy_update(
                    TrainedPolicy(model, torch.optim.SGD(model.parameters(), lr=0.0)),
                    episodes,
                    advantages,
                    weights,
                    ClippedPolicyLoss(),
                    UpdateSettings(micro_batch_tokens=1000, pad_id=0, max_grad_norm=1.0),
                    group_size=group_size,
                )
            )
    for handle in handles:
        handle.remove()
    for stats in results:
        assert all(isinstance(v, (int, float)) for v in vars(stats).values())
        assert stats.policy_tokens == 10 and stats.clip_fraction > 0
    assert results[0].loss == pytest.approx(results[1].loss, abs=1e-6)


def test_rows_without_advantage_are_not_forwarded_and_change_no_gradient(rolled):
    """A group whose rewards are all equal has zero advantage: its loss and gradient are exactly 0,
    so it is left out of the forward passes; the gradient is the one of the rows that carry signal."""
    model, tokenizer, trajectories = rolled
    episodes, _ = sequences(trajectories)
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.tensor([0.0, 0.0, 0.0, -1.0, 0.5, 0.5])  # group 1 silent, group 2 not
    grads, stats = [], []
    for rows in (range(6), range(3, 6)):
        captured = []

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                captured.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)

        stats.append(
            policy_update(
                TrainedPolicy(model, Capture(model.parameters(), lr=0.0)),
                [episodes[i] for i in rows],
                advantages[list(rows)],
                [weights[i] for i in rows],
                ClippedPolicyLoss(),
                UpdateSettings(micro_batch_tokens=100_000, pad_id=tokenizer.pad_token_id),
                group_size=3,
            )
        )
        grads.append(captured)
    assert (
        stats[0].tokens == stats[1].tokens == sum(e.ids.numel() for e in episodes[3:]) - 2 * episodes[3].prompt_length
    )
    assert stats[0].policy_tokens == stats[1].policy_tokens
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_a_batch_without_any_advantage_leaves_the_weights_and_the_optimizer_as_they_are(tiny_model_dir, rolled):
    """AdamW would still move the weights on a step of zero gradients (its momentum): a batch with no
    learning signal takes no optimizer step. With a KL term the rows do carry a gradient and train."""
    _, tokenizer, trajectories = rolled
    model, _ = load_model(tiny_model_dir)
    episodes, _ = sequences(trajectories)
    weights = TokenMean().weights([e.mask for e in episodes])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    policy = TrainedPolicy(model, optimizer, schedule)
    settings = UpdateSettings(micro_batch_tokens=100_000, pad_id=tokenizer.pad_token_id)
    policy_update(policy, episodes, torch.linspace(-1, 1, 6), weights, ClippedPolicyLoss(), settings, group_size=3)
    before = [p.detach().clone() for p in model.parameters()]
    moments = [s["exp_avg"].clone() for s in optimizer.state.values()]
    stats = policy_update(policy, episodes, torch.zeros(6), weights, ClippedPolicyLoss(), settings, group_size=3)
    assert stats.micro_batches == 0 and stats.grad_norm == 0.0 and stats.policy_tokens == 0
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, optimizer.state.values()))
    assert schedule.last_epoch == 2  # the schedule counts the step all the same
    for p in model.parameters():  # what a plain step of zero gradients would have done: momentum moves the weights
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert not all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    reference = Reference(load_model(tiny_model_dir)[0])
    with_kl = TrainedPolicy(model, optimizer, schedule, reference)
    kl = policy_update(
        with_kl, episodes, torch.zeros(6), weights, ClippedPolicyLoss(kl_beta=0.1), settings, group_size=3
    )
    assert kl.micro_batches == 2 and kl.grad_norm > 0
    every_row = UpdateSettings(micro_batch_tokens=100_000, pad_id=tokenizer.pad_token_id, skip_zero_advantage=False)
    every = policy_update(
        policy, episodes, torch.zeros(6), weights, ClippedPolicyLoss(), every_row, group_size=3
    )  # algorithm.skip_zero_advantage: false
    assert every.micro_batches == 2 and every.policy_tokens == sum(int(e.mask.sum()) for e in episodes)
    # No token in the loss (every episode failed or too stale): nothing forwarded and no step, KL
    # term or not (``silent_rows`` knows these rows; the update has no second check of its own).
    before = [p.detach().clone() for p in model.parameters()]
    none = [torch.zeros_like(w) for w in weights]
    for loss, trained in ((ClippedPolicyLoss(), policy), (ClippedPolicyLoss(kl_beta=0.1), with_kl)):
        stats = policy_update(trained, episodes, torch.linspace(-1, 1, 6), none, loss, every_row, group_size=3)
        assert stats.micro_batches == 0 and stats.grad_norm == 0.0
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_groups_share_their_prompt_on_a_cpu_and_run_as_padded_rows_on_cuda_unless_told():
    # On an H100 the update behind shared prompts took 2.9 s, padded rows 1.05 s (Qwen3-0.6B).
    from rollforge.train.config import load_config
    from rollforge.train.micro_batches import shares_prompts

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)  # a device object needs no GPU
    assert (shares_prompts("auto", cpu), shares_prompts("auto", cuda)) == (True, False)
    assert (shares_prompts(True, cuda), shares_prompts(False, cpu)) == (True, False)
    assert load_config().optim.share_prompts == "auto"
    assert load_config(overrides=["optim.share_prompts=true"]).optim.share_prompts is True
    with pytest.raises(Exception, match="share_prompts"):
        load_config(overrides=["optim.share_prompts=sometimes"])


def test_micro_batch_tokens_auto_is_the_cpus_setting_there_and_sized_from_free_memory_on_cuda(monkeypatch):
    from types import SimpleNamespace

    from transformers import Qwen3Config

    from rollforge.train import micro_batches
    from rollforge.train.config import load_config

    qwen3 = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28)  # Qwen3-0.6B's shape
    # per token: 2 bytes x 2 (the float32 norms) x 28 layers x (10 x 1024 + 4 x 3072) = 2,523,136 bytes
    assert micro_batches.activation_bytes_per_token(qwen3) == 2_523_136

    def on(device: str) -> SimpleNamespace:  # a model's parameters and config, without a GPU
        return SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device(device))]), config=qwen3)

    assert micro_batches.micro_batch_tokens_for("auto", on("cpu")) == 4096
    assert micro_batches.micro_batch_tokens_for(2048, on("cuda")) == 2048  # a number as given, anywhere
    free = {"bytes": 139 * 2**30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free["bytes"], 141 * 2**30))
    # half of 139 GiB over 2,523,136 bytes a token: 29,576 tokens, in multiples of 1024
    assert micro_batches.micro_batch_tokens_for("auto", on("cuda")) == 28_672
    free["bytes"] = 2**30  # little free: never below the CPU's setting
    assert micro_batches.micro_batch_tokens_for("auto", on("cuda")) == 4096
    free["bytes"] = 2**40  # plenty: never past the ceiling
    assert micro_batches.micro_batch_tokens_for("auto", on("cuda")) == 65536
    assert load_config().optim.micro_batch_tokens == "auto"
    assert load_config(overrides=["optim.micro_batch_tokens=8192"]).optim.micro_batch_tokens == 8192
    with pytest.raises(Exception, match="micro_batch_tokens"):
        load_config(overrides=["optim.micro_batch_tokens=0"])
