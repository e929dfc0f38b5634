"""The update step on the tiny model: logprobs agree with generation, micro-batching does not
change the gradient, and only policy tokens move the loss."""

import pytest
import torch

from rollforge import ChatRenderer, HFBackend, RolloutConfig, rollout
from rollforge.envs.library import get_env_spec
from rollforge.models import load_model
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.update import Episode, pack_micro_batches, policy_update, sequence_logprobs


@pytest.fixture(scope="module")
def rolled(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    spec = get_env_spec("guess_number")
    backend = HFBackend(model, tokenizer)
    try:
        samples = [s for s in spec.samples(2, 0) for _ in range(3)]  # two groups of three
        result = rollout(samples, {"guess_number": spec.build()}, backend, ChatRenderer(tokenizer),
                         RolloutConfig(max_turns=3, max_new_tokens=6, seed=1))
    finally:
        import asyncio

        asyncio.run(backend.close())
    return model, tokenizer, result.trajectories


def test_trainer_logprobs_match_the_generation_logprobs(rolled):
    model, tokenizer, trajectories = rolled
    assert any(t.turns > 1 for t in trajectories)  # multi-turn: env tokens sit between policy tokens
    for t in trajectories:
        e = Episode.from_trajectory(t)
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
    episodes = [Episode.from_trajectory(t) for t in trajectories]
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

        stats = policy_update(model, Capture(model.parameters(), lr=0.0), episodes, advantages, weights,
                              ClippedPolicyLoss(), micro_batch_tokens=budget, pad_id=tokenizer.pad_token_id,
                              group_size=group_size)
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
