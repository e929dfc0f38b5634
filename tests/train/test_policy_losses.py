"""GSPO and CISPO against numbers worked out by hand and against autograd of their papers' formulas,
with the aggregations, the corrections and micro-batching; their clip defaults in the config; and
the engine/trainer mismatch every loss measures."""

import math
from pathlib import Path

import pytest
import torch

from rollforge.errors import ConfigError
from rollforge.models import load_model
from rollforge.train.config import AlgorithmConfig, load_config
from rollforge.train.corrections import MaskedImportance, Proximal, TruncatedImportance
from rollforge.train.losses import ClippedPolicyLoss, SequenceMean, TokenMean, mismatch
from rollforge.train.policy_losses import POLICY_LOSSES, CISPOLoss, GSPOLoss, policy_loss
from rollforge.train.step_metrics import merge_update_stats, mismatch_metrics
from rollforge.train.logprobs import sequence_logprobs
from rollforge.train.update import TrainedPolicy, UpdateRow, UpdateSettings, UpdateStats, policy_update

from grouped_rows import grouped_rows

ln = math.log

# Two sequences, behaviour logprobs 0, so log r_t = logp_t. Row 0 (A = +1): position 0 is off the
# mask (a huge ratio that must not count), then log r = ln 2, ln 0.5: s_0 = exp((ln 2 + ln 0.5) / 2) = 1.
# Row 1 (A = -1): log r = ln 2 three times: s_1 = 2.
OLD = torch.zeros(2, 3)
LOGP = torch.tensor([[50.0, ln(2), ln(0.5)], [ln(2), ln(2), ln(2)]])
ADV = torch.tensor([1.0, -1.0])
MASKS = [torch.tensor([0.0, 1, 1]), torch.tensor([1.0, 1, 1])]


def _run(loss_fn, weights, logp=LOGP, old=OLD, advantages=ADV, proximal=None):
    logp = logp.clone().requires_grad_(True)
    parts = loss_fn(logp, old, advantages, weights, None, proximal)
    parts.loss.backward()
    return parts, logp.grad


def test_gspo_clips_the_sequence_ratio_not_the_tokens():
    # sequence weights: row 0 1/(2*2) = 0.25 per token, row 1 1/(2*3) = 1/6. Clip 0.2 / 0.2:
    #   row 0: s = 1 inside [0.8, 1.2]: pg_t = -min(1 * 1, 1 * 1) = -1           -> 2 * 0.25 * -1 = -0.5
    #   row 1: s = 2, A = -1: min(-2, clip(2) * -1 = -1.2) = -2 (unclipped) -> pg 2 -> 3 * 1/6 * 2 = +1
    #   loss 0.5 = the paper's -1/G sum_i min(s_i A_i, clip(s_i) A_i) = -(1 + -2) / 2
    # gradient: d pg_t / d logp_t = -A s_i, times w_t: row 0 -1 * 1 * 0.25 = -0.25; row 1 2 * 1/6 = 1/3
    weights = torch.stack(SequenceMean().weights(MASKS))
    parts, grad = _run(GSPOLoss(0.2, 0.2), weights)
    assert parts.loss.item() == pytest.approx(0.5)
    assert grad.flatten().tolist() == pytest.approx([0, -0.25, -0.25, 1 / 3, 1 / 3, 1 / 3])
    assert (parts.tokens, parts.clipped_tokens) == (5, 0)
    assert parts.ratio_sum == pytest.approx(2 * 1 + 3 * 2)  # each token carries its sequence's ratio
    # PPO on the same tokens clips row 0's r = 2 (A = +1: min(2, 1.2)), which GSPO's mean of 1 does not
    assert ClippedPolicyLoss(0.2, 0.2)(LOGP, OLD, ADV, weights).clipped_tokens == 1


def test_gspo_with_token_weights_weighs_a_sequence_by_its_length():
    # token weights 1/5 each: row 0 2 * 0.2 * -1 = -0.4, row 1 3 * 0.2 * 2 = 1.2 -> 0.8
    parts, grad = _run(GSPOLoss(0.2, 0.2), torch.stack(TokenMean().weights(MASKS)))
    assert parts.loss.item() == pytest.approx(0.8)
    assert grad.flatten().tolist() == pytest.approx([0, -0.2, -0.2, 0.4, 0.4, 0.4])


def test_gspo_default_band_is_the_papers_3e_4_and_4e_4():
    # A = +1 for both. Row 0: log r = 2e-4, 0 -> s = e^1e-4 = 1.0001, inside [0.9997, 1.0004]: pg -s,
    # gradient -s * 0.25 per token. Row 1: log r = 1e-3 each -> s = 1.0010005 > 1.0004: clipped,
    # pg = -1.0004 and no gradient; its 3 tokens count as clipped. Loss = -(1.0001 + 1.0004) / 2.
    logp = torch.tensor([[0.0, 2e-4, 0.0], [1e-3, 1e-3, 1e-3]])
    weights = torch.stack(SequenceMean().weights(MASKS))
    parts, grad = _run(GSPOLoss(), weights, logp=logp, advantages=torch.tensor([1.0, 1.0]))
    s0 = math.exp(1e-4)
    assert parts.loss.item() == pytest.approx(-(s0 + 1.0004) / 2, abs=1e-7)
    assert grad.flatten().tolist() == pytest.approx([0, -s0 / 4, -s0 / 4, 0, 0, 0], abs=1e-7)
    assert (parts.tokens, parts.clipped_tokens) == (5, 3)


def test_gspo_gradient_is_autograd_of_the_sequence_level_objective():
    # J = -1/G sum_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean over row i's policy tokens of
    # logp - logp_old), differentiated by autograd, against GSPO-token with sequence weights.
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 6, generator=g) * 3
    logp = old + (torch.rand(4, 6, generator=g) - 0.5) * 0.6
    masks = (torch.rand(4, 6, generator=g) > 0.3).float()
    masks[:, 0] = 0  # a prompt token
    advantages = torch.tensor([1.0, -1.0, 0.5, -2.0])
    x = logp.clone().requires_grad_(True)
    s = torch.exp(((x - old) * masks).sum(1) / masks.sum(1))  # (B,)
    objective = torch.minimum(s * advantages, torch.clamp(s, 0.9, 1.05) * advantages)
    (-(objective.mean())).backward()
    expected = x.grad
    weights = torch.stack(SequenceMean().weights(list(masks)))
    parts, grad = _run(GSPOLoss(0.1, 0.05), weights, logp=logp, old=old, advantages=advantages)
    assert parts.loss.item() == pytest.approx(float(-objective.detach().mean()), abs=1e-6)
    assert torch.allclose(grad, expected, atol=1e-6)
    assert 0 < parts.clipped_tokens < parts.tokens  # both branches taken: s ranges over the band


def test_cispo_weighs_reinforce_by_the_clipped_detached_ratio():
    # One row, A = +1, weights 0.5 on tokens 1, 2 (token 0 off the mask). Clip 0.2 / 0.2.
    #   token 1: r = 1.5 -> w = 1.2 (clipped), logp = ln 0.5: pg = -1.2 * ln 0.5 = 0.83178
    #   token 2: r = 0.5 -> w = 0.8 (clipped), logp = ln 0.25: pg = -0.8 * ln 0.25 = 1.10904
    #   loss = 0.5 * (0.83178 + 1.10904) = 0.97041
    # gradient -w * A * weight: -0.6, -0.4: the clipped tokens still learn (PPO: token 1 gets none)
    logp = torch.tensor([[9.0, ln(0.5), ln(0.25)]])
    old = logp - torch.log(torch.tensor([[1.0, 1.5, 0.5]]))
    weights = torch.tensor([[0.0, 0.5, 0.5]])
    parts, grad = _run(CISPOLoss(0.2, 0.2), weights, logp=logp, old=old, advantages=torch.tensor([1.0]))
    assert parts.loss.item() == pytest.approx(0.5 * (-1.2 * ln(0.5) - 0.8 * ln(0.25)))
    assert grad.flatten().tolist() == pytest.approx([0.0, -0.6, -0.4])
    assert (parts.tokens, parts.clipped_tokens) == (2, 2)
    assert parts.ratio_sum == pytest.approx(2.0)
    _, ppo_grad = _run(ClippedPolicyLoss(0.2, 0.2), weights, logp=logp, old=old, advantages=torch.tensor([1.0]))
    assert ppo_grad.flatten().tolist() == pytest.approx([0.0, 0.0, -0.25])  # r 1.5 clipped away; 0.5 * r 0.5


def test_cispo_defaults_bound_the_weight_from_above_only():
    # Defaults clip_low 1 (lower bound 0), clip_high 3 (cap 4). A = -1, weights 1/3, logp = ln 0.5:
    #   r = 0.01 -> w 0.01;  r = 1 -> w 1;  r = 6 -> w 4 (the one clipped token)
    #   loss = sum 1/3 * (-w * -1 * ln 0.5) = (0.01 + 1 + 4) * ln 0.5 / 3; gradient w / 3
    logp = torch.full((1, 3), ln(0.5))
    old = logp - torch.log(torch.tensor([[0.01, 1.0, 6.0]]))
    parts, grad = _run(CISPOLoss(), torch.full((1, 3), 1 / 3), logp=logp, old=old, advantages=torch.tensor([-1.0]))
    assert parts.loss.item() == pytest.approx(5.01 * ln(0.5) / 3)
    assert grad.flatten().tolist() == pytest.approx([0.01 / 3, 1 / 3, 4 / 3])
    assert parts.clipped_tokens == 1


def test_cispo_gradient_is_autograd_of_its_formula():
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 5, generator=g) * 3
    logp = old + torch.randn(3, 5, generator=g)
    weights = (torch.rand(3, 5, generator=g) > 0.3).float() / 11
    advantages = torch.randn(3, generator=g)
    x = logp.clone().requires_grad_(True)
    w = torch.clamp(torch.exp(x - old), 0.5, 1.3).detach()
    (-(weights * w * advantages[:, None] * x).sum()).backward()
    parts, grad = _run(CISPOLoss(0.5, 0.3), weights, logp=logp, old=old, advantages=advantages)
    assert torch.allclose(grad, x.grad, atol=1e-6)
    assert 0 < parts.clipped_tokens < parts.tokens


def test_corrections_weigh_cispo_per_token_and_gspo_per_sequence():
    # First epoch: logp = logp_prox, so r = 1; behaviour weights b = exp(prox - old) = 3 and 0.5.
    # CISPO, truncated at cap 2: f = 2, 0.5; A = +1, weights 0.5, logp = ln 0.5, ln 0.25:
    #   loss = 0.5 * (-2 * ln 0.5) + 0.5 * (-0.5 * ln 0.25) = 1.5 ln 2; gradient -f * 0.5 = -1, -0.25
    logp = torch.tensor([[ln(0.5), ln(0.25)]])
    old = logp - torch.log(torch.tensor([[3.0, 0.5]]))
    weights, one = torch.tensor([[0.5, 0.5]]), torch.tensor([1.0])
    parts, grad = _run(CISPOLoss(correction=TruncatedImportance(2.0)), weights, logp, old, one, logp.clone())
    assert parts.loss.item() == pytest.approx(1.5 * ln(2))
    assert grad.flatten().tolist() == pytest.approx([-1.0, -0.25])
    assert (parts.off_policy_tokens, parts.behaviour_weight_sum) == (1, 2.5)
    # GSPO: one weight for the sequence, b = exp((ln 3 + ln 0.5) / 2) = sqrt(1.5) = 1.2247: under
    # cap 2 it stays (both tokens weigh 1.2247); at cap 1.2 it is truncated to 1.2 for both; the
    # band [1/1.2, 1.2] masks the whole sequence. s = 1: pg_t = -1, loss = -f.
    b = math.sqrt(1.5)
    for correction, factor, cut in (
        (TruncatedImportance(2.0), b, 0),
        (TruncatedImportance(1.2), 1.2, 2),
        (MaskedImportance(1.2), 0.0, 2),
    ):
        parts, grad = _run(GSPOLoss(correction=correction), weights, logp, old, one, logp.clone())
        assert parts.loss.item() == pytest.approx(-factor)
        assert grad.flatten().tolist() == pytest.approx([-0.5 * factor, -0.5 * factor])
        assert (parts.off_policy_tokens, parts.behaviour_weight_sum) == pytest.approx((cut, 2 * factor))


def test_the_kl_term_is_the_same_for_every_objective():
    ref = LOGP + torch.tensor([[7.0, ln(2), 0.0], [0.0, -ln(2), 0.0]])  # position (0, 0) is off the mask
    weights = torch.stack(TokenMean().weights(MASKS))
    # k3 per token: delta = ln 2 -> 1 - ln 2; delta = -ln 2 -> 0.5 - 1 + ln 2; others 0; weights 1/5
    expected = (1 - ln(2) + ln(2) - 0.5) / 5
    for kind in POLICY_LOSSES.values():
        with_kl = kind(kl_beta=0.5)(LOGP, OLD, ADV, weights, ref)
        without = kind()(LOGP, OLD, ADV, weights)
        assert with_kl.kl == pytest.approx(expected)
        assert with_kl.loss.item() == pytest.approx(without.loss.item() + 0.5 * expected)


# --- the engine/trainer mismatch ---------------------------------------------------------------------


def test_mismatch_is_the_k3_kl_and_largest_log_gap_on_policy_tokens():
    # g = logp_trainer - logp_old = ln 2, 0, -ln 2 on the policy tokens (position 0: off the mask, 40):
    #   k3 = e^g - 1 - g: 1 - ln 2, 0, ln 2 - 0.5 -> sum 0.5; largest |g| = ln 2
    old = torch.tensor([[0.0, -1.0, -2.0, -3.0]])
    trainer = old + torch.tensor([[40.0, ln(2), 0.0, -ln(2)]])
    on = torch.tensor([[False, True, True, True]])
    kl_sum, largest = mismatch(old, trainer, on)
    assert kl_sum == pytest.approx(0.5) and largest == pytest.approx(ln(2))
    assert mismatch(old, old, on) == (0.0, 0.0)


@pytest.mark.parametrize(
    "loss_fn",
    [
        ClippedPolicyLoss(),
        ClippedPolicyLoss(correction=TruncatedImportance()),
        GSPOLoss(correction=MaskedImportance()),
        CISPOLoss(),
    ],
)
def test_every_loss_measures_the_mismatch_against_the_pre_update_policy(loss_fn):
    old = torch.tensor([[0.0, -1.0, -2.0, -3.0]])
    proximal = old + torch.tensor([[40.0, ln(2), 0.0, -ln(2)]])
    weights = torch.tensor([[0.0, 1 / 3, 1 / 3, 1 / 3]])
    moved = proximal + 0.3  # a later epoch: the current policy has moved, the proximal one has not
    parts = loss_fn(moved, old, torch.tensor([1.0]), weights, None, proximal)
    assert (parts.mismatch_kl_sum, parts.mismatch_max_abs_log_ratio) == pytest.approx((0.5, ln(2)))
    if not loss_fn.needs_proximal:  # without a Proximal: the current logprobs (the first epoch's)
        alone = loss_fn(proximal, old, torch.tensor([1.0]), weights)
        assert (alone.mismatch_kl_sum, alone.mismatch_max_abs_log_ratio) == pytest.approx((0.5, ln(2)))


def test_mismatch_metrics_average_over_policy_tokens_and_take_the_largest_gap():
    base = dict(
        loss=0.0, policy_loss=0.0, kl=0.0, clip_fraction=0.0, mean_ratio=1.0, grad_norm=1.0, micro_batches=1, tokens=50
    )
    one = UpdateStats(**base, policy_tokens=10, off_policy_tokens=2, mismatch_kl=0.01, mismatch_max_abs_log_ratio=0.5)
    two = UpdateStats(**base, policy_tokens=30, off_policy_tokens=4, mismatch_kl=0.05, mismatch_max_abs_log_ratio=0.2)
    merged = merge_update_stats([one, two])
    # kl: (0.01 * 10 + 0.05 * 30) / 40 = 0.04; max 0.5; 6 of 40 tokens truncated or masked
    assert mismatch_metrics(merged) == pytest.approx(
        {"mismatch/kl": 0.04, "mismatch/max_abs_log_ratio": 0.5, "mismatch/off_policy_share": 0.15}
    )
    assert set(mismatch_metrics(UpdateStats(**base, policy_tokens=0)).values()) == {None}  # nothing measured


def test_the_trained_model_generating_has_no_mismatch(tiny_model_dir):
    """``hf`` at max_staleness 0: the behaviour logprobs are the trainer's own, so the mismatch that
    ``auto`` leaves uncorrected there is ~0 (batching noise only)."""
    from rollforge import ChatRenderer, HFBackend, RolloutConfig, rollout
    from rollforge.envs.library import get_env_spec
    from rollforge.train.update import sequences

    model, tokenizer = load_model(tiny_model_dir)
    spec = get_env_spec("guess_number")
    backend = HFBackend(model, tokenizer)
    try:
        samples = [s for s in spec.samples(2, 0) for _ in range(2)]
        result = rollout(
            samples,
            {"guess_number": spec.build()},
            backend,
            ChatRenderer(tokenizer),
            RolloutConfig(max_turns=2, max_new_tokens=6, seed=1),
        )
    finally:
        import asyncio

        asyncio.run(backend.close())
    episodes, _ = sequences(result.trajectories)
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.linspace(-1, 1, len(episodes))
    stats = policy_update(
        TrainedPolicy(model, torch.optim.SGD(model.parameters(), lr=0.0)),
        episodes,
        advantages,
        weights,
        policy_loss(),
        UpdateSettings(micro_batch_tokens=100_000, pad_id=tokenizer.pad_token_id),
        proximal=Proximal(len(episodes)),
    )
    assert stats.policy_tokens > 0
    assert 0 <= stats.mismatch_kl < 1e-8 and stats.mismatch_max_abs_log_ratio < 1e-4


# --- micro-batching on the tiny model ----------------------------------------------------------------


def _episodes(model, groups=2, size=3):
    """``groups`` groups of ``size`` rows sharing a 7-token prompt, of different lengths, an
    environment token (mask 0) in the middle; behaviour logprobs the model's own minus ln 1.3, ln 0.8
    or 0 per member (and +-0.05 per token), so sequence ratios leave a narrow band and some behaviour
    weights (1.3) pass a cap of 1.1."""
    episodes = []
    for i, row in enumerate(grouped_rows(2, groups, size)):
        ids, mask = row.ids, row.mask
        with torch.no_grad():
            own = sequence_logprobs(model, ids[None], torch.ones_like(ids)[None], mask[None] > 0)[0]
        shift = ln([1.3, 0.8, 1.0][i % size]) + 0.05 * torch.tensor([1.0, -1.0]).repeat(ids.numel())[: ids.numel()]
        episodes.append(UpdateRow(ids, mask, (own - shift) * mask, prompt_length=row.prompt_length))
    return episodes


@pytest.mark.parametrize(
    "loss_fn", [GSPOLoss(0.1, 0.1), CISPOLoss(0.1, 0.1), GSPOLoss(correction=TruncatedImportance(1.1))]
)
def test_micro_batches_and_shared_prompts_give_the_full_batch_gradient(tiny_model_dir, loss_fn):
    # a row (a sequence) is never split: its GSPO mean is over its own tokens however rows are packed
    model, _ = load_model(tiny_model_dir)
    model.requires_grad_(True)
    episodes = _episodes(model)
    weights = SequenceMean().weights([e.mask for e in episodes])
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5, -0.25])
    runs = []
    for group_size, budget in ((1, 100_000), (1, 1), (3, 100_000), (3, 40)):
        captured = []

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                captured.extend(p.grad.clone() for p in model.parameters() if p.grad is not None)

        stats = policy_update(
            TrainedPolicy(model, Capture(model.parameters(), lr=0.0)),
            episodes,
            advantages,
            weights,
            loss_fn,
            UpdateSettings(micro_batch_tokens=budget, pad_id=0),
            group_size=group_size,
            proximal=Proximal(len(episodes)),
        )
        runs.append((stats, captured))
    (first, grads), *others = runs
    assert [s.micro_batches for s, _ in runs] == [1, 6, 2, 4]
    assert any(g.abs().sum() > 0 for g in grads)
    assert first.clip_fraction > 0 or first.off_policy_tokens > 0  # the clip or the correction at work
    for stats, other in others:
        assert stats.loss == pytest.approx(first.loss, abs=1e-6)
        assert stats.clip_fraction == first.clip_fraction and stats.behaviour_weight_mean == pytest.approx(
            first.behaviour_weight_mean, abs=1e-6
        )
        for a, b in zip(grads, other):
            assert torch.allclose(a, b, atol=1e-5)


# --- configuration -----------------------------------------------------------------------------------


def test_each_policy_loss_brings_its_own_clip_range_unless_set():
    for name, kind in POLICY_LOSSES.items():
        algo = AlgorithmConfig(policy_loss=name)
        assert (algo.clip_low, algo.clip_high) == kind.default_clip == (kind().clip_low, kind().clip_high)
    assert AlgorithmConfig(policy_loss="gspo", clip_high=1e-3).clip_low == 3e-4  # one set, the other the loss's
    assert AlgorithmConfig(policy_loss="gspo", clip_high=1e-3).clip_high == 1e-3
    config = load_config(None, ["algorithm.policy_loss=cispo"])
    assert (config.algorithm.clip_low, config.algorithm.clip_high) == (1.0, 3.0)
    written = config.model_dump(mode="json")  # the config.yaml a run writes: the values it ran with
    assert load_config(None, [], **written).algorithm == config.algorithm
    with pytest.raises(ConfigError, match="policy_loss"):
        load_config(None, ["algorithm.policy_loss=grpo"])


def _first_code(prompts, completions, **_):
    """A dense reward (the first character's code point), so every group has variance."""
    return [ord((c[-1]["content"] if c else " ")[:1] or " ") / 100 for c in completions]


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_a_run_trains_with_the_chosen_loss_and_logs_the_mismatch(tiny_config, name):
    import yaml

    from rollforge.recipes.launch import train
    from rollforge.inputs.rewards import RewardFunction

    config = tiny_config("steps=1", f"algorithm.policy_loss={name}", "algorithm.epochs_per_batch=2", "optim.lr=1e-2")
    [step] = train(config, reward_functions=[RewardFunction("first_code", _first_code)], console=False).history
    assert step["policy_tokens"] > 0 and step["grad_norm"] > 0
    # hf at max_staleness 0: no correction, and the second epoch still measures the engine (~0), not
    # the first epoch's step (lr 1e-2 moves the tiny model's logprobs by far more than 1e-4)
    assert step["mismatch/kl"] < 1e-8 and step["mismatch/max_abs_log_ratio"] < 1e-4
    assert abs(step["mean_ratio"] - 1) > 1e-3  # the second epoch's ratio to the behaviour policy: moved
    assert step["mismatch/off_policy_share"] == 0 and step["off_policy_tokens"] == 0
    written = yaml.safe_load((Path(config.out) / "config.yaml").read_text())  # the values the run used
    assert (written["algorithm"]["clip_low"], written["algorithm"]["clip_high"]) == POLICY_LOSSES[name].default_clip
