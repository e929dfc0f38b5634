"""One policy update on a batch of trajectories: micro-batches sized by tokens, accumulated
gradients, clipping, one optimizer step.

Trajectories become ``UpdateRow`` tensors, one per segment (``sequences``): the token ids exactly as
rolled out, the loss mask, and the generation logprobs aligned to the ids (0 where the mask is 0).
A trajectory whose template rewrote history has several segments; each is a sequence of its own
that carries its episode's advantage (group statistics stay per episode), and under
``SequenceMean`` aggregation each segment counts as one sequence. The current policy's logprobs
come from ``logprobs.sequence_logprobs``; rows whose ids show images carry them (``RowImages``) and
are forwarded with their pixels (``vision.batch_logprobs``).

What an update changes and how travel as two frozen values built once per run: ``TrainedPolicy``
(the model, its optimizer and schedule, the KL reference, the ranks it is sharded over) and
``UpdateSettings`` (micro-batch budget, padding id, gradient clipping, compute precision, whether
rows without advantage are skipped). Only the batch and its grouping change from call to call.

The rollouts of one prompt (a GRPO group) share their prompt tokens: each group runs as one
micro-batch whose prompt is computed once (``plan_micro_batches``); that removes
(group_size - 1) / group_size of the prompt compute. Without groups, episodes are sorted by length
and packed greedily into micro-batches whose padded size (rows x longest row) stays within
``micro_batch_tokens``. The loss weights are computed for the whole batch beforehand (see
``losses``), so the accumulated gradient equals the full-batch gradient whatever the packing.

Devices: episodes live on the CPU; each micro-batch is built on the model's device (that of its
first parameter) and the statistics come back as Python numbers. With a ``compute_dtype`` below
the weights' float32 (bfloat16), the forward passes and the loss run under ``torch.autocast`` and
the backward pass outside it (see ``policy``).

Policy lag: the ratio of a policy loss (``losses``, ``policy_losses``) is taken against the
generation (behaviour) logprobs; with asynchronous training (``max_staleness`` > 0) those come from
weights up to k versions old (with ``vllm``/``openai``, from another engine), and a correction
(``corrections.py``: AReaL's ``decoupled`` loss, ``masked`` importance sampling) takes the clipped
ratio against the *proximal* policy instead, the weights before this batch's first optimizer step,
and weighs each token by the detached behaviour weight.
Each call takes one optimizer step after all its micro-batches, so the first epoch's forward
passes already run the proximal weights: their detached logprobs are the proximal logprobs (no
extra forward) and go into the ``Proximal`` the caller passes, indexed by episode; later epochs
(``epochs_per_batch`` > 1, one call each) read them back. Given a ``Proximal``, every loss records
them too (a copy to the CPU per row): the engine/trainer mismatch (``UpdateStats.mismatch_*``) is
measured against them, so a later epoch measures the engine, not its own earlier steps.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..types import Segment, Trajectory
from .corrections import Proximal
from .distributed import Ranks
from .logprobs import sequence_logprobs
from .losses import LossParts, PolicyLoss
from .micro_batches import plan_micro_batches, silent_rows
from .vision import RowImages, batch_logprobs, with_images


@dataclass(frozen=True)
class UpdateRow:
    ids: torch.Tensor  # (T,) long
    mask: torch.Tensor  # (T,) float, 1 on policy tokens
    old_logprobs: torch.Tensor  # (T,) float, 0 off the mask
    prompt_length: int = 0
    images: RowImages | None = None  # the images its ids show (``vision.with_images``), None: text only

    @classmethod
    def from_segment(cls, segment: Segment) -> "UpdateRow":
        mask = torch.tensor(segment.loss_mask, dtype=torch.float32)
        old = torch.tensor([lp if lp is not None else 0.0 for lp in segment.logprobs], dtype=torch.float32)
        return cls(torch.tensor(segment.token_ids, dtype=torch.long), mask, old, segment.prompt_length)


def sequences(trajectories: Sequence[Trajectory], images: Any = None) -> tuple[list[UpdateRow], list[int]]:
    """One ``UpdateRow`` per segment of each trajectory, in order, and the index of the trajectory
    each comes from (to give it the trajectory's advantage: ``advantages[owners]``). ``images``: a
    vision renderer's ``ImageProcessing``, to give rows the images their ids show."""
    episodes, owners = [], []
    for i, trajectory in enumerate(trajectories):
        for segment in trajectory.segments:
            episodes.append(with_images(UpdateRow.from_segment(segment), images, trajectory, segment))
            owners.append(i)
    return episodes, owners


@dataclass(frozen=True)
class UpdateStats:
    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    mean_ratio: float
    grad_norm: float
    micro_batches: int
    tokens: int  # tokens forwarded (policy and context)
    policy_tokens: int
    behaviour_weight_mean: float = 1.0  # mean over policy tokens of the off-policy correction's factor
    off_policy_tokens: int = 0  # policy tokens the correction truncated (decoupled) or masked (masked)
    mismatch_kl: float = 0.0  # mean over policy tokens of k3 KL(behaviour || trainer before the update)
    mismatch_max_abs_log_ratio: float = 0.0  # max over policy tokens of |logp_trainer - logp_behaviour|


@dataclass(frozen=True)
class Reference:
    """The frozen policy the KL term is measured against: a separate model, or the trained
    model itself with its LoRA adapter switched off."""

    model: Any
    disable_adapter: bool = False


@dataclass(frozen=True)
class TrainedPolicy:
    """The policy an update changes, with what changes it: the model (sharded over ``ranks`` when
    there are several), its optimizer and learning-rate schedule, and the KL reference (None: no
    KL term). Built once per run; a checkpoint writes it."""

    model: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    reference: Reference | None = None
    ranks: Ranks = field(default_factory=Ranks)


@dataclass(frozen=True)
class UpdateSettings:
    """How every update of a run runs (built once from the config)."""

    micro_batch_tokens: int  # padded tokens (rows x longest row) of one micro-batch at most
    pad_id: int  # the tokenizer's padding id
    max_grad_norm: float | None = None  # clip the gradient norm to this (None: measure only)
    compute_dtype: torch.dtype = torch.float32  # the forward passes' precision (bfloat16: autocast)
    skip_zero_advantage: bool = True  # rows without advantage (and no KL term) are not forwarded


def collate(episodes: Sequence[UpdateRow], weights: Sequence[torch.Tensor], pad_id: int, device: torch.device):
    """(B, T) ids, attention, old logprobs and loss weights on ``device``, right-padded."""
    length = max(e.ids.numel() for e in episodes)
    ids = torch.full((len(episodes), length), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros((len(episodes), length), dtype=torch.long, device=device)
    old = torch.zeros((len(episodes), length), device=device)
    w = torch.zeros((len(episodes), length), device=device)
    for row, (e, wt) in enumerate(zip(episodes, weights)):
        n = e.ids.numel()
        ids[row, :n], attention[row, :n], old[row, :n], w[row, :n] = e.ids, 1, e.old_logprobs, wt
    return ids, attention, old, w


def mixed_precision(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the forward passes, or nothing when computing in float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def policy_update(
    policy: TrainedPolicy,
    episodes: Sequence[UpdateRow],
    advantages: torch.Tensor,  # (N,)
    weights: Sequence[torch.Tensor],  # per episode, (T_i,)
    loss_fn: PolicyLoss,
    settings: UpdateSettings,
    *,
    group_size: int = 1,
    proximal: Proximal | None = None,
) -> UpdateStats:
    """Accumulate the loss over micro-batches and take one optimizer step. ``group_size``: episodes
    come in groups of that many rollouts of one prompt (their shared prompt is computed once).
    ``proximal``: one ``Proximal(len(episodes))`` per batch, passed to each of its epochs (the first
    call fills it, later ones read it): a loss that ``needs_proximal`` must have it.
    With several ``policy.ranks`` (a sharded model) every rank runs as many micro-batches as the
    busiest one (each FSDP forward and backward is a collective); ``weights`` must be normalised over
    the global batch. Rows without a gradient are not forwarded (``silent_rows``; those without
    advantage only with ``skip_zero_advantage``), and without other rows no optimizer step is taken."""
    if (proximal is None and loss_fn.needs_proximal) or (proximal is not None and len(proximal) != len(episodes)):
        raise ValueError(
            f"{type(loss_fn).__name__} needs proximal=Proximal({len(episodes)}) (one per batch, "
            f"shared by its epochs), got {proximal!r}"
        )
    model, reference = policy.model, policy.reference
    device = next(model.parameters()).device
    model.train()
    policy.optimizer.zero_grad(set_to_none=True)
    totals = _Totals()
    silent = silent_rows(advantages, weights, loss_fn, reference, settings.skip_zero_advantage)
    batches = plan_micro_batches(episodes, group_size, settings.micro_batch_tokens, skip=silent)
    if (busiest := policy.ranks.most(len(batches))) == 0:  # no rank has a token to learn from: weights stay
        return totals.stats(skip_step(policy), micro_batches=0)
    for _ in range(busiest - len(batches)):
        _empty_pass(model, settings.pad_id, device)
    for batch in batches:
        rows = batch.rows
        members = [episodes[i] for i in rows]
        ids, attention, old, w = collate(members, [weights[i] for i in rows], settings.pad_id, device)
        with mixed_precision(device, settings.compute_dtype):
            ref = None
            if reference is not None:
                with torch.no_grad(), _reference_context(reference):
                    ref = batch_logprobs(reference.model, members, ids, attention, w != 0, batch.prefix)
            logprobs = batch_logprobs(model, members, ids, attention, w != 0, batch.prefix)
            lengths = [episodes[i].ids.numel() for i in rows]
            prox = None if proximal is None else proximal.take(rows, lengths, logprobs)
            parts = loss_fn(logprobs, old, advantages[rows].to(device), w, ref, prox)
        parts.loss.backward()
        totals.add(parts, forwarded=int(attention.sum()) - (len(rows) - 1) * batch.prefix)
    grad_norm = optimizer_step(model, policy.optimizer, settings.max_grad_norm, policy.scheduler)
    return totals.stats(grad_norm, micro_batches=len(batches))


def skip_step(policy: TrainedPolicy) -> float:
    """A batch with no learning signal: no optimizer step, so AdamW's momentum does not move the
    weights either (a step of zero gradients would); the schedule still advances. Gradient norm 0."""
    policy.optimizer.zero_grad(set_to_none=True)
    if policy.scheduler is not None:
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": on purpose
            warnings.simplefilter("ignore", UserWarning)
            policy.scheduler.step()
    policy.model.eval()
    return 0.0


@dataclass
class _Totals:
    """The running sums of one ``policy_update`` over its micro-batches, and the stats they give."""

    loss: float = 0.0
    policy_loss: float = 0.0
    kl: float = 0.0
    clipped: int = 0
    tokens: int = 0  # forwarded, the shared prompt counted once
    policy_tokens: int = 0
    ratio: float = 0.0
    behaviour_weight: float = 0.0
    off_policy: int = 0
    mismatch_kl: float = 0.0
    mismatch_max: float = 0.0

    def add(self, parts: LossParts, forwarded: int) -> None:
        self.loss += float(parts.loss.detach())
        self.policy_loss += parts.policy_loss
        self.kl += parts.kl
        self.clipped += parts.clipped_tokens
        self.policy_tokens += parts.tokens
        self.ratio += parts.ratio_sum
        self.behaviour_weight += parts.behaviour_weight_sum
        self.off_policy += parts.off_policy_tokens
        self.mismatch_kl += parts.mismatch_kl_sum
        self.mismatch_max = max(self.mismatch_max, parts.mismatch_max_abs_log_ratio)
        self.tokens += forwarded

    def stats(self, grad_norm: float, micro_batches: int) -> UpdateStats:
        n = max(self.policy_tokens, 1)
        return UpdateStats(
            loss=self.loss,
            policy_loss=self.policy_loss,
            kl=self.kl,
            clip_fraction=self.clipped / n,
            mean_ratio=self.ratio / n,
            grad_norm=grad_norm,
            micro_batches=micro_batches,
            tokens=self.tokens,
            policy_tokens=self.policy_tokens,
            behaviour_weight_mean=self.behaviour_weight / n if self.policy_tokens else 1.0,
            off_policy_tokens=self.off_policy,
            mismatch_kl=self.mismatch_kl / n,
            mismatch_max_abs_log_ratio=self.mismatch_max,
        )


def _empty_pass(model: Any, pad_id: int, device: torch.device) -> None:
    """A forward and backward that contributes nothing, so this rank joins the other ranks'
    collectives for a micro-batch it does not have."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    logprobs = sequence_logprobs(model, ids, torch.ones_like(ids), torch.tensor([[False, True]], device=device))
    (logprobs.sum() * 0.0).backward()


def _reference_context(reference: Reference):
    if reference.disable_adapter:
        return reference.model.disable_adapter()
    return contextlib.nullcontext()


def optimizer_step(model: Any, optimizer: Any, max_grad_norm: float | None, scheduler: Any = None) -> float:
    """Clip (when ``max_grad_norm`` is set), step the optimizer and the learning-rate ``scheduler``,
    zero the gradients and leave the model in eval mode; returns the gradient norm before clipping."""
    params = [p for p in model.parameters() if p.requires_grad]
    # clip_grad_norm_ reduces sharded (DTensor) gradients across ranks; an infinite bound only measures
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else math.inf)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return grad_norm
