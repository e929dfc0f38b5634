"""The off-policy corrections (decoupled, masked) against numbers worked out by hand, their
reduction to today's loss at zero lag, ``auto`` per staleness and backend, and the proximal
logprobs ``policy_update`` records."""

import copy
import json
import math
import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from rollforge.errors import ConfigError
from rollforge.models import load_model
from rollforge.train.corrections import (
    Correction,
    DecoupledPolicyLoss,
    MaskedImportance,
    MaskedPolicyLoss,
    Proximal,
    TruncatedImportance,
    resolve_correction,
)
from rollforge.train.distributed import Ranks
from rollforge.train.losses import ClippedPolicyLoss, LossParts, TokenMean
from rollforge.train.policy_losses import CISPOLoss, GSPOLoss, policy_loss
from rollforge.train.step_metrics import merge_update_stats
from rollforge.train.logprobs import sequence_logprobs
from rollforge.train.update import TrainedPolicy, UpdateRow, UpdateSettings, UpdateStats, policy_update

from grouped_rows import grouped_rows

ln = math.log

# Two rows of three tokens, clip 0.2 / 0.2, cap 2, advantages +1 and -1, aggregation weights below
# (row 1's first token is off the mask: huge values that must not count). Per token, chosen by
# r = exp(logp - logp_prox) and b = exp(logp_prox - logp_behav):
#   (0,0) r 1    b 1     A +1  unclipped: pg -1
#   (0,1) r 1.1  b 3     A +1  unclipped: pg -1.1; decoupled caps b at 2; masked drops it (3 > 2)
#   (0,2) r 1.5  b 0.7   A +1  clipped:   min(1.5, 1.2) = 1.2 -> pg -1.2, no gradient
#   (1,1) r 0.5  b 0.25  A -1  clipped:   min(-0.5, -0.8) = -0.8 -> pg 0.8, no gradient; masked (0.25 < 1/2)
#   (1,2) r 1.5  b 1     A -1  unclipped: min(-1.5, -1.2) = -1.5 -> pg 1.5
PROX = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -0.2]])
LOGP = PROX + torch.log(torch.tensor([[1.0, 1.1, 1.5], [1.0, 0.5, 1.5]]))
BEHAV = PROX - torch.log(torch.tensor([[1.0, 3.0, 0.7], [1.0, 0.25, 1.0]]))
LOGP[1, 0], BEHAV[1, 0] = 5.0, -9.0  # off the mask
WEIGHTS = torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.5, 0.5]])
ADV = torch.tensor([1.0, -1.0])


def _run(loss_fn, prox=PROX, logp=LOGP, behav=BEHAV, ref=None):
    logp = logp.clone().requires_grad_(True)
    parts = loss_fn(logp, behav, ADV, WEIGHTS, ref, prox)
    parts.loss.backward()
    return parts, logp.grad


def test_decoupled_truncates_the_behaviour_weight_at_the_cap():
    # loss = sum w * f(b) * pg, f(b) = min(b, 2):
    #   (0,0) 0.5 * 1 * -1       = -0.5
    #   (0,1) 0.25 * 2 * -1.1    = -0.55  (b = 3 truncated to 2)
    #   (0,2) 0.25 * 0.7 * -1.2  = -0.21
    #   (1,1) 0.5 * 0.25 * 0.8   = +0.1
    #   (1,2) 0.5 * 1 * 1.5      = +0.75          total -0.41
    # d loss / d logp = -w f(b) A r on unclipped tokens, 0 on clipped ones:
    #   (0,0) -0.5 * 1 * 1 * 1 = -0.5; (0,1) -0.25 * 2 * 1 * 1.1 = -0.55; (1,2) -0.5 * 1 * -1 * 1.5 = +0.75
    parts, grad = _run(DecoupledPolicyLoss(0.2, 0.2, cap=2.0))
    assert parts.loss.item() == pytest.approx(-0.41)
    assert grad.flatten().tolist() == pytest.approx([-0.5, -0.55, 0.0, 0.0, 0.0, 0.75])
    assert (parts.tokens, parts.clipped_tokens, parts.off_policy_tokens) == (5, 2, 1)
    assert parts.behaviour_weight_sum == pytest.approx(1 + 2 + 0.7 + 0.25 + 1)
    assert parts.ratio_sum == pytest.approx(1 + 1.1 + 1.5 + 0.5 + 1.5)  # the ratio to the proximal policy


def test_masked_drops_tokens_whose_behaviour_weight_leaves_the_band():
    # band [1/2, 2]: (0,1) b = 3 and (1,1) b = 0.25 are masked (factor 0), the others weigh 1:
    #   (0,0) 0.5 * -1 = -0.5; (0,2) 0.25 * -1.2 = -0.3; (1,2) 0.5 * 1.5 = +0.75      total -0.05
    # gradients: (0,0) -0.5, (1,2) +0.75; the masked and the clipped tokens none
    parts, grad = _run(MaskedPolicyLoss(0.2, 0.2, cap=2.0))
    assert parts.loss.item() == pytest.approx(-0.05)
    assert grad.flatten().tolist() == pytest.approx([-0.5, 0.0, 0.0, 0.0, 0.0, 0.75])
    assert (parts.tokens, parts.clipped_tokens, parts.off_policy_tokens) == (5, 1, 2)  # (1,1) is masked, not clipped
    assert parts.behaviour_weight_sum == 3.0


def test_none_takes_the_ratio_to_the_behaviour_policy_and_ignores_the_proximal():
    # r = exp(logp - behav) = r_prox * b: (0,0) 1, (0,1) 3.3 -> clipped 1.2, (0,2) 1.05, (1,1) 0.125 -> A = -1:
    # min(-0.125, -0.8) = -0.8 clipped, (1,2) 1.5 -> 1.5:
    #   0.5 * -1 + 0.25 * -1.2 + 0.25 * -1.05 + 0.5 * 0.8 + 0.5 * 1.5 = 0.0875
    parts, grad = _run(ClippedPolicyLoss(0.2, 0.2))
    assert parts.loss.item() == pytest.approx(0.0875)
    assert grad.flatten().tolist() == pytest.approx([-0.5, 0.0, -0.25 * 1.05, 0.0, 0.0, 0.75])
    assert (parts.clipped_tokens, parts.off_policy_tokens, parts.behaviour_weight_sum) == (2, 0, 5.0)


@pytest.mark.parametrize("correction", [DecoupledPolicyLoss, MaskedPolicyLoss])
def test_without_lag_each_correction_is_exactly_todays_loss(correction):
    # logp_prox == logp_behav: b = 1 everywhere, so f(b) = 1 and the ratio is today's; with the KL term on
    g = torch.Generator().manual_seed(0)
    behav = -torch.rand(4, 6, generator=g) * 4
    logp = behav + (torch.rand(4, 6, generator=g) - 0.5)  # ratios 0.61 .. 1.65: both clip branches taken
    ref = behav + (torch.rand(4, 6, generator=g) - 0.5)
    weights = (torch.rand(4, 6, generator=g) > 0.2).float() / 20
    advantages = torch.randn(4, generator=g)
    outcomes = []
    for loss_fn in (ClippedPolicyLoss(0.2, 0.28, 0.1), correction(0.2, 0.28, 0.1, cap=1.5)):
        x = logp.clone().requires_grad_(True)
        parts = loss_fn(x, behav, advantages, weights, ref, behav.clone())
        parts.loss.backward()
        outcomes.append((parts, x.grad))
    (today, today_grad), (corrected, corrected_grad) = outcomes
    assert today.clipped_tokens > 0 and today.clipped_tokens < today.tokens
    assert torch.equal(today.loss, corrected.loss) and torch.equal(today_grad, corrected_grad)
    assert vars(today) | {"loss": None} == vars(corrected) | {"loss": None}  # same stats, kl included


def test_auto_corrects_where_the_behaviour_logprobs_are_not_the_trainers_own():
    # the trained model generating in the synchronous loop: its logprobs are the trainer's -> none
    assert resolve_correction("auto", 0, "hf") == "none"
    # another engine (at staleness 0 too) or older weights -> truncated importance sampling
    assert [resolve_correction("auto", 0, b) for b in ("vllm", "openai")] == ["decoupled", "decoupled"]
    assert [resolve_correction("auto", 2, b) for b in ("hf", "vllm")] == ["decoupled", "decoupled"]
    assert resolve_correction("none", 0, "vllm") == "none" and resolve_correction("masked", 0, "hf") == "masked"
    with pytest.raises(ConfigError, match=r"unknown off_policy_correction 'tis'; expected one of \['auto', "):
        resolve_correction("tis", 0)


def test_policy_loss_by_name():
    assert type(policy_loss().correction) is Correction  # ppo, auto -> none at k = 0 on hf: today's loss
    assert type(policy_loss()) is ClippedPolicyLoss and not policy_loss().needs_proximal
    vllm = policy_loss(backend="vllm")
    assert type(vllm.correction) is TruncatedImportance and vllm.needs_proximal and vllm.correction.cap == 2.0
    assert type(policy_loss(max_staleness=2).correction) is TruncatedImportance
    assert type(policy_loss(correction="none", max_staleness=2).correction) is Correction
    masked = policy_loss("cispo", correction="masked", clip_low=0.1, clip_high=0.3, kl_beta=0.05, cap=3.0)
    assert type(masked) is CISPOLoss and type(masked.correction) is MaskedImportance
    assert (masked.clip_low, masked.clip_high, masked.kl_beta, masked.correction.cap) == (0.1, 0.3, 0.05, 3.0)
    gspo = policy_loss("gspo", backend="openai")
    assert type(gspo) is GSPOLoss and (gspo.clip_low, gspo.clip_high) == (3e-4, 4e-4)  # its own defaults
    assert type(gspo.correction) is TruncatedImportance
    assert type(DecoupledPolicyLoss(cap=3.0).correction) is TruncatedImportance
    assert type(MaskedPolicyLoss().correction) is MaskedImportance
    with pytest.raises(ConfigError, match=r"unknown policy_loss 'grpo'; expected one of \['cispo', 'gspo', 'ppo'\]"):
        policy_loss("grpo")
    with pytest.raises(ConfigError, match=r"unknown off_policy_correction 'tis'; expected one of \['auto', "):
        policy_loss(correction="tis")
    with pytest.raises(ConfigError, match="importance_cap must be > 1, got 1.0"):
        policy_loss(correction="decoupled", cap=1.0)
    with pytest.raises(ValueError, match="needs proximal_logprobs"):
        DecoupledPolicyLoss()(LOGP, BEHAV, ADV, WEIGHTS)


@pytest.mark.parametrize(
    "name, backend, staleness, kind, correction",
    [
        ("ppo", "hf", 0, ClippedPolicyLoss, Correction),
        ("gspo", "vllm", 0, GSPOLoss, TruncatedImportance),
        ("cispo", "hf", 1, CISPOLoss, TruncatedImportance),
    ],
)
def test_the_runs_objective_follows_the_algorithm_section(name, backend, staleness, kind, correction):
    from rollforge.train.config import TrainConfig
    from rollforge.train.run_setup import objective  # the run's own wiring

    config = TrainConfig(model={"backend": backend}, algorithm={"policy_loss": name, "max_staleness": staleness})
    loss_fn, _ = objective(config)
    assert type(loss_fn) is kind and type(loss_fn.correction) is correction
    assert (
        (loss_fn.clip_low, loss_fn.clip_high)
        == kind.default_clip
        == (config.algorithm.clip_low, config.algorithm.clip_high)
    )


def test_ranks_merge_the_behaviour_statistics_by_policy_tokens():
    base = dict(
        loss=0.0, policy_loss=0.0, kl=0.0, clip_fraction=0.0, mean_ratio=1.0, grad_norm=1.0, micro_batches=1, tokens=50
    )
    merged = merge_update_stats(
        [
            UpdateStats(**base, policy_tokens=10, behaviour_weight_mean=0.5, off_policy_tokens=3),
            UpdateStats(**base, policy_tokens=30, behaviour_weight_mean=1.5, off_policy_tokens=1),
        ]
    )
    assert merged.behaviour_weight_mean == (0.5 * 10 + 1.5 * 30) / 40 and merged.off_policy_tokens == 4
    assert UpdateStats(**base, policy_tokens=0).behaviour_weight_mean == 1.0  # no correction: weight 1, nothing cut


# --- policy_update on the tiny model -----------------------------------------------------------------


def _batch(model, groups=2, size=3):
    """``groups`` groups of ``size`` episodes sharing a 7-token prompt, continuations of different
    lengths (the planner reorders a group's rows longest first) with an environment token (mask 0)
    in the middle. Behaviour logprobs are the model's own minus ln 3 (b = 3: truncated or masked at
    cap 2), ln 0.7 or 0, cycling over the positions."""
    episodes = grouped_rows(1, groups, size)
    own = _logprobs(model, episodes)
    shifted = []
    for e, lp in zip(episodes, own):
        shift = torch.tensor([ln(3.0), ln(0.7), 0.0]).repeat(e.ids.numel())[: e.ids.numel()] * e.mask
        shifted.append(UpdateRow(e.ids, e.mask, (lp - shift) * e.mask, e.prompt_length))
    return shifted


def _logprobs(model, episodes):
    """Each episode's logprobs under ``model``, scored alone (no prompt sharing, no packing)."""
    with torch.no_grad():
        return [
            sequence_logprobs(model, e.ids[None], torch.ones_like(e.ids)[None], e.mask[None] > 0)[0] for e in episodes
        ]


def _update(model, episodes, loss_fn, proximal, group_size, budget, reference=None):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5, -0.25])
    policy = TrainedPolicy(model, optimizer, reference=reference)
    settings = UpdateSettings(micro_batch_tokens=budget, pad_id=0, max_grad_norm=1.0)
    return [
        policy_update(
            policy, episodes, advantages, weights, loss_fn, settings, group_size=group_size, proximal=proximal
        )
        for _ in range(2)
    ]  # epochs_per_batch 2: one call per epoch, one Proximal for the batch


@pytest.mark.parametrize("group_size, budget", [(3, 100_000), (3, 40), (1, 40)])
def test_the_first_epoch_records_the_pre_update_policy_and_the_second_reuses_it(tiny_model_dir, group_size, budget):
    model, _ = load_model(tiny_model_dir)
    model.requires_grad_(True)
    episodes = _batch(model)
    before = _logprobs(model, episodes)  # an independent forward of the pre-update weights, row by row
    proximal = Proximal(len(episodes))
    loss_fn = DecoupledPolicyLoss(cap=2.0)
    first, second = _update(model, episodes, loss_fn, proximal, group_size, budget)
    for recorded, expected, e in zip(proximal.logprobs, before, episodes):
        assert torch.allclose(recorded, expected, atol=1e-5)
        assert recorded[e.mask == 0].abs().sum() == 0
    # every third policy token has b = 3 (truncated), every third b = 0.7, in both epochs alike
    shifts = [torch.tensor([3.0, 0.7, 1.0]).repeat(e.ids.numel())[: e.ids.numel()][e.mask > 0] for e in episodes]
    tokens = sum(len(s) for s in shifts)
    expected_weight = sum(float(s.clamp(max=2.0).sum()) for s in shifts) / tokens
    for stats in (first, second):
        assert stats.policy_tokens == tokens
        assert stats.off_policy_tokens == sum(int((s == 3.0).sum()) for s in shifts) > 0
        assert stats.behaviour_weight_mean == pytest.approx(expected_weight, abs=1e-5)
    assert first.mean_ratio == pytest.approx(1.0, abs=1e-6) and first.clip_fraction == 0  # r = 1 in the first epoch
    assert abs(second.mean_ratio - 1.0) > 1e-3  # the second epoch's ratio is to the recorded, older policy


def test_the_second_epochs_loss_is_taken_against_the_recorded_proximal_policy(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    model.requires_grad_(True)
    episodes = _batch(model)
    before = _logprobs(model, episodes)
    proximal = Proximal(len(episodes))
    loss_fn = DecoupledPolicyLoss(cap=2.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    weights = TokenMean().weights([e.mask for e in episodes])
    advantages = torch.tensor([1.0, -0.5, 0.25, -1.0, 0.5, -0.25])
    policy, settings = TrainedPolicy(model, optimizer), UpdateSettings(micro_batch_tokens=100_000, pad_id=0)
    kwargs = dict(group_size=3, proximal=proximal)
    policy_update(policy, episodes, advantages, weights, loss_fn, settings, **kwargs)
    after = _logprobs(model, episodes)  # the weights the second epoch starts from
    expected = sum(
        float(loss_fn(lp[None], e.old_logprobs[None], advantages[i : i + 1], w[None], None, prox[None]).loss)
        for i, (e, lp, w, prox) in enumerate(zip(episodes, after, weights, before))
    )
    second = policy_update(policy, episodes, advantages, weights, loss_fn, settings, **kwargs)
    assert second.loss == pytest.approx(expected, abs=1e-5)
    with pytest.raises(
        ValueError, match=r"needs proximal=Proximal\(6\) \(one per batch, shared by its epochs\), got None"
    ):
        policy_update(policy, episodes, advantages, weights, loss_fn, settings)


def test_lora_records_the_adapted_policy(tiny_model_dir):
    pytest.importorskip("peft")
    from rollforge.train.config import LoraConfig, ModelConfig
    from rollforge.train.policy import load_policy
    from rollforge.train.update import Reference

    model, _ = load_policy(ModelConfig(name=str(tiny_model_dir), device="cpu"), LoraConfig(enabled=True, r=4))
    episodes = _batch(model)
    before = _logprobs(model, episodes)
    proximal = Proximal(len(episodes))
    first, second = _update(
        model,
        episodes,
        MaskedPolicyLoss(cap=2.0, kl_beta=0.1),
        proximal,
        3,
        40,
        reference=Reference(model, disable_adapter=True),
    )
    after = _logprobs(model, episodes)
    for recorded, expected, moved, e in zip(proximal.logprobs, before, after, episodes):
        on = e.mask > 0
        assert torch.allclose(recorded, expected, atol=1e-5)
        assert not torch.allclose(recorded[on], moved[on], atol=1e-4)  # the adapter has moved since
    assert first.off_policy_tokens == second.off_policy_tokens > 0  # b = 3 is outside [1/2, 2]
    assert first.kl == pytest.approx(0.0, abs=1e-6) and second.kl > 0  # against the adapter-less base


class TodaysLoss:
    """``ClippedPolicyLoss`` as it was before the corrections, frozen: the reference for ``none``."""

    needs_proximal = False

    def __call__(self, logprobs, old_logprobs, advantages, weights, ref_logprobs=None, _proximal=None):
        advantages = advantages[:, None]
        on = weights != 0
        ratio = torch.exp(torch.where(on, logprobs - old_logprobs, torch.zeros_like(logprobs)))
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, 0.8, 1.2) * advantages
        policy_loss = (weights * -torch.minimum(unclipped, clipped)).sum()
        return LossParts(
            policy_loss,
            float(policy_loss.detach()),
            0.0,
            int(((clipped < unclipped) & on).sum()),
            int(on.sum()),
            float(ratio.detach()[on].sum()),
            float(on.sum()),
            0,
        )


def test_none_updates_exactly_as_before(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    model.requires_grad_(True)
    episodes = _batch(model)
    twin = copy.deepcopy(model)
    proximal = Proximal(len(episodes))
    today = _update(twin, episodes, TodaysLoss(), None, 3, 40)
    corrected = _update(model, episodes, policy_loss(), proximal, 3, 40)
    unmeasured = [replace(s, mismatch_kl=0.0, mismatch_max_abs_log_ratio=0.0) for s in corrected]
    assert today == unmeasured  # every other statistic of both epochs, bit for bit
    assert all(s.clip_fraction > 0 for s in corrected)  # ratios to the behaviour policy of 3 and 0.7
    assert [(s.behaviour_weight_mean, s.off_policy_tokens) for s in corrected] == [(1.0, 0), (1.0, 0)]
    # the mismatch is measured against the recorded pre-update logprobs in both epochs: per policy
    # token g = ln 3, ln 0.7 or 0 (``_batch``), k3 = e^g - 1 - g = 2 - ln 3, -0.3 - ln 0.7 or 0
    shifts = [torch.tensor([3.0, 0.7, 1.0]).repeat(e.ids.numel())[: e.ids.numel()][e.mask > 0] for e in episodes]
    weight = torch.cat(shifts)  # b = e^g
    expected = float((weight - 1 - torch.log(weight)).mean())
    for stats in corrected:
        assert stats.mismatch_kl == pytest.approx(expected, abs=1e-5)
        assert stats.mismatch_max_abs_log_ratio == pytest.approx(ln(3.0), abs=1e-5)
    assert all(p is not None for p in proximal.logprobs)  # recorded for the mismatch, not used by the loss
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name
    assert {f.name for f in fields(UpdateStats)} >= {"behaviour_weight_mean", "off_policy_tokens"}


@pytest.mark.slow
def test_two_ranks_take_the_one_rank_decoupled_epochs(tiny_model_dir, tmp_path):
    """Two epochs on 2 ranks (gloo, FSDP2; the ranks run different numbers of micro-batches, so one
    runs empty passes, and each records its own share's proximal logprobs) equal them in one process."""
    import off_policy_ranks_worker as worker

    worker_path = Path(__file__).resolve().parent / "off_policy_ranks_worker.py"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(worker_path),
            str(tiny_model_dir),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model, epochs, proximal = worker.update(str(tiny_model_dir), Ranks())
    assert all(p is not None for p in proximal.logprobs)
    initial, _ = load_model(tiny_model_dir)
    sharded = torch.load(tmp_path / "weights.pt")
    moved = 0.0
    for name, value in model.state_dict().items():
        assert torch.allclose(sharded[name], value, atol=1e-6), name
        moved = max(moved, float((value - initial.state_dict()[name]).abs().max()))
    assert moved > 1e-3  # two real steps
    for one, two in zip(epochs, (UpdateStats(**s) for s in json.loads((tmp_path / "stats.json").read_text()))):
        assert (one.policy_tokens, one.off_policy_tokens) == (two.policy_tokens, two.off_policy_tokens)
        assert one.off_policy_tokens > 0
        for key in ("loss", "behaviour_weight_mean", "mean_ratio", "clip_fraction"):
            assert getattr(one, key) == pytest.approx(getattr(two, key), abs=1e-5), key
    assert epochs[0].mean_ratio == pytest.approx(1.0, abs=1e-6) and abs(epochs[1].mean_ratio - 1) > 1e-4
