"""One policy update on a batch of trajectories: micro-batches sized by tokens, accumulated
gradients, clipping, one optimizer step.

Trajectories become ``UpdateRow`` tensors, one per segment (``sequences``): the token ids exactly as
rolled out, the loss mask, and the generation logprobs aligned to the ids (0 where the mask is 0).
A trajectory whose template rewrote history has several segments; each is a sequence of its own
that carries its episode's advantage (group statistics stay per episode), and under
``SequenceMean`` aggregation each segment counts as one sequence. The current policy's logprob
of token i comes from the logits at position i - 1, so a forward pass over ids[:-1] scores ids[1:].
The vocabulary projection runs only on the positions that predict a policy token.

The rollouts of one prompt (a GRPO group) share their prompt tokens: each group runs as one
micro-batch whose prompt is computed once and whose rows continue from its cached keys and values
(``plan_micro_batches``); that removes (group_size - 1) / group_size of the prompt compute. Those
rows run unpadded, packed end to end behind the prompt with a block-causal mask.
Without groups, episodes are sorted by length and packed greedily into micro-batches whose padded
size (rows x longest row) stays within ``micro_batch_tokens``. The loss weights are computed for the whole batch beforehand (see ``losses``), so the
accumulated gradient equals the full-batch gradient whatever the packing.

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
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..types import Segment, Trajectory
from .corrections import Proximal
from .distributed import Ranks, is_sharded
from .losses import LossParts, PolicyLoss
from .micro_batches import plan_micro_batches, silent_rows


@dataclass(frozen=True)
class UpdateRow:
    ids: torch.Tensor  # (T,) long
    mask: torch.Tensor  # (T,) float, 1 on policy tokens
    old_logprobs: torch.Tensor  # (T,) float, 0 off the mask
    prompt_length: int = 0

    @classmethod
    def from_segment(cls, segment: Segment) -> "UpdateRow":
        mask = torch.tensor(segment.loss_mask, dtype=torch.float32)
        old = torch.tensor([lp if lp is not None else 0.0 for lp in segment.logprobs], dtype=torch.float32)
        return cls(torch.tensor(segment.token_ids, dtype=torch.long), mask, old, segment.prompt_length)


def sequences(trajectories: Sequence[Trajectory]) -> tuple[list[UpdateRow], list[int]]:
    """One ``UpdateRow`` per segment of each trajectory, in order, and the index of the trajectory
    each comes from (to give it the trajectory's advantage: ``advantages[owners]``)."""
    episodes, owners = [], []
    for i, trajectory in enumerate(trajectories):
        for segment in trajectory.segments:
            episodes.append(UpdateRow.from_segment(segment))
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


def sequence_logprobs(
    model: Any, ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor, prefix: int = 0
) -> torch.Tensor:
    """(B, T) logprob under ``model`` of each token where ``targets`` is true, given the tokens
    before it; 0 elsewhere (and at position 0, which has no context). With ``prefix`` > 0 every
    row starts with the same ``prefix`` ids, which are computed once for the batch.

    The vocabulary projection is the costliest matmul of a small model's forward and backward
    (576 x 49152 per token for SmolLM2-135M), so when the model's logits are plain ``lm_head(h)``
    it is applied only to the hidden states that predict a target token; otherwise the logits are
    computed from the first target onward.
    """
    batch, length = ids.shape
    rows, cols = targets[:, 1:].nonzero(as_tuple=True)  # token cols + 1 is a target
    out = torch.zeros(batch, length, device=ids.device)
    if rows.numel() == 0:
        return out
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    picked = ids[rows, cols + 1]
    if _plain_lm_head(base):
        if is_sharded(model):  # one decoder pass, so every rank's FSDP collectives line up
            out[rows, cols + 1] = _sharded_forward(model)(ids, attention, rows, cols, picked, 0)
        else:
            out[rows, cols + 1] = _head_logprobs(model, ids, attention, rows, cols, picked, prefix)
        return out
    first = int(cols.min())
    keep = length - first
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep, use_cache=False).logits
    out[rows, cols + 1] = _picked_logprobs(logits[rows, cols - first], picked)
    return out


#: Logits (tokens x vocabulary) the head computes at once before it goes chunk by chunk, and the
#: size of a chunk; each chunk is recomputed in the backward pass. A 16k-token pack of a 152k-id
#: vocabulary would hold 10 GiB of float32 logits and as much again for their gradient: on an H100
#: a Qwen3-0.6B pack ran out of memory there (2026-11-26); in chunks of 2**30 logits it ran at 36% MFU.
LOGIT_BUDGET, LOGIT_CHUNK = 2**30, 2**28


def _picked_logprobs(logits: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """(N,) float32 log-softmax of the (N, V) ``logits`` at the ids ``picked``."""
    logits = logits.float()
    return logits.gather(-1, picked[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _head_and_logprobs(head: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    return _picked_logprobs(head(hidden), picked)


def _target_logprobs(head: Any, hidden: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """(N,) logprobs of ``picked`` under ``head`` applied to the (N, H) ``hidden``; past
    ``LOGIT_BUDGET`` logits, ``LOGIT_CHUNK`` at a time (chunks recomputed in the backward pass)."""
    weight = getattr(head, "weight", None)
    if weight is None or hidden.shape[0] * weight.shape[0] <= LOGIT_BUDGET:
        return _head_and_logprobs(head, hidden, picked)
    step = max(1, LOGIT_CHUNK // weight.shape[0])
    from torch.utils.checkpoint import checkpoint

    chunks = zip(hidden.split(step), picked.split(step))
    if not torch.is_grad_enabled():
        return torch.cat([_head_and_logprobs(head, h, p) for h, p in chunks])
    return torch.cat([checkpoint(_head_and_logprobs, head, h, p, use_reentrant=False) for h, p in chunks])


def _head_logprobs(
    model: Any,
    ids: torch.Tensor,
    attention: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    picked: torch.Tensor,
    prefix: int,
) -> torch.Tensor:
    """(N,) logprobs of the ids ``picked`` at the positions (rows, cols) only: the decoder over every
    token (the shared ``prefix`` once), then the head on the hidden states that predict a target."""
    batch = ids.shape[0]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder()
    if prefix:
        shared = decoder(input_ids=ids[:1, :prefix], use_cache=True)
        rest = _packed_continuations(decoder, ids, attention.sum(dim=1), prefix, shared.past_key_values)
        hidden = torch.cat([shared.last_hidden_state.expand(batch, -1, -1), rest], dim=1)
    else:
        hidden = decoder(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    return _target_logprobs(base.get_output_embeddings(), hidden[rows, cols], picked)


#: The name under which a sharded model runs ``_head_logprobs`` as an FSDP forward of its root (the
#: root gathers its own weights, the embeddings and the head, and reduces their gradients).
SHARDED_FORWARD = "rollforge_head_logprobs"


def _sharded_forward(model: Any) -> Any:
    """``_head_logprobs`` as a forward of the FSDP root ``model``, registered on its first use (so
    whoever shards the model, ``distributed.shard``, needs to know nothing of the update)."""
    if not hasattr(model, SHARDED_FORWARD):
        import types

        from torch.distributed.fsdp import register_fsdp_forward_method

        setattr(model, SHARDED_FORWARD, types.MethodType(_head_logprobs, model))
        register_fsdp_forward_method(model, SHARDED_FORWARD)
    return getattr(model, SHARDED_FORWARD)


def _packed_continuations(
    decoder: Any, ids: torch.Tensor, lengths: torch.Tensor, prefix: int, cache: Any
) -> torch.Tensor:
    """(B, T - prefix, H) hidden states of every row's tokens after the shared ``prefix`` (whose keys
    and values are in ``cache``, batch 1), zero on padding. The rows run unpadded, end to end as one
    sequence: each token attends to the prefix and to its own row's earlier tokens (a block-causal
    mask, positions restarting at ``prefix`` per row), so no compute goes to padding."""
    batch, length = ids.shape
    rests = (lengths - prefix).tolist()
    owner = torch.repeat_interleave(torch.arange(batch, device=ids.device), lengths - prefix)  # (S,)
    offset = torch.cat([torch.arange(n, device=ids.device) for n in rests])  # (S,) index within its row
    flat = ids[owner, prefix + offset][None]  # (1, S)
    own_past = (owner[:, None] == owner[None, :]) & (offset[:, None] >= offset[None, :])  # (S, S)
    mask = torch.cat([own_past.new_ones(len(owner), prefix), own_past], dim=1)[None, None]  # (1, 1, S, prefix + S)
    out = decoder(
        input_ids=flat, attention_mask=mask, position_ids=(prefix + offset)[None], past_key_values=cache, use_cache=True
    )
    hidden = out.last_hidden_state[0]  # (S, H)
    return hidden.new_zeros(batch, length - prefix, hidden.shape[-1]).index_put((owner, offset), hidden)


def _plain_lm_head(model: Any) -> bool:
    """Whether the model's logits are exactly ``get_output_embeddings()(decoder output)``."""
    config = model.config.get_text_config(decoder=True)
    scaled = any(
        getattr(config, name, None) not in (None, 1, 1.0) for name in ("final_logit_softcapping", "logit_scale")
    )
    return not scaled and callable(getattr(model, "get_decoder", None)) and model.get_output_embeddings() is not None


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
    model: Any,
    optimizer: torch.optim.Optimizer,
    episodes: Sequence[UpdateRow],
    advantages: torch.Tensor,  # (N,)
    weights: Sequence[torch.Tensor],  # per episode, (T_i,)
    loss_fn: PolicyLoss,
    *,
    micro_batch_tokens: int,
    pad_id: int,
    max_grad_norm: float | None = None,
    reference: Any = None,
    group_size: int = 1,
    compute_dtype: torch.dtype = torch.float32,
    ranks: Ranks = Ranks(),
    scheduler: Any = None,
    proximal: Proximal | None = None,
    skip_zero_advantage: bool = True,
) -> UpdateStats:
    """Accumulate the loss over micro-batches and take one optimizer step. ``group_size``: episodes
    come in groups of that many rollouts of one prompt (their shared prompt is computed once).
    ``proximal``: one ``Proximal(len(episodes))`` per batch, passed to each of its epochs (the first
    call fills it, later ones read it): a loss that ``needs_proximal`` must have it.
    ``compute_dtype``: precision of the forward passes (bfloat16: under ``torch.autocast``).
    With several ``ranks`` (a sharded model) every rank runs as many micro-batches as the busiest
    one (each FSDP forward and backward is a collective); ``weights`` must be normalised over the
    global batch. Rows without a gradient are not forwarded (``silent_rows``; those without advantage
    only with ``skip_zero_advantage``), and without other rows no optimizer step is taken."""
    if (proximal is None and loss_fn.needs_proximal) or (proximal is not None and len(proximal) != len(episodes)):
        raise ValueError(
            f"{type(loss_fn).__name__} needs proximal=Proximal({len(episodes)}) (one per batch, "
            f"shared by its epochs), got {proximal!r}"
        )
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    totals, silent = _Totals(), silent_rows(advantages, weights, loss_fn, reference, skip_zero_advantage)
    batches = plan_micro_batches(episodes, group_size, micro_batch_tokens, skip=silent)
    if (busiest := ranks.most(len(batches))) == 0:  # no rank has a token to learn from: weights stay
        return totals.stats(skip_step(optimizer, scheduler, model), micro_batches=0)
    for _ in range(busiest - len(batches)):
        _empty_pass(model, pad_id, device)
    for batch in batches:
        rows = batch.rows
        ids, attention, old, w = collate([episodes[i] for i in rows], [weights[i] for i in rows], pad_id, device)
        with mixed_precision(device, compute_dtype):
            ref = None
            if reference is not None:
                with torch.no_grad(), _reference_context(reference):
                    ref = sequence_logprobs(reference.model, ids, attention, w != 0, batch.prefix)
            logprobs = sequence_logprobs(model, ids, attention, w != 0, batch.prefix)
            lengths = [episodes[i].ids.numel() for i in rows]
            prox = None if proximal is None else proximal.take(rows, lengths, logprobs)
            parts = loss_fn(logprobs, old, advantages[rows].to(device), w, ref, prox)
        parts.loss.backward()
        totals.add(parts, forwarded=int(attention.sum()) - (len(rows) - 1) * batch.prefix)
    grad_norm = optimizer_step(model, optimizer, max_grad_norm, scheduler)
    return totals.stats(grad_norm, micro_batches=len(batches))


def skip_step(optimizer: Any, scheduler: Any, model: Any) -> float:
    """A batch with no learning signal: no optimizer step, so AdamW's momentum does not move the
    weights either (a step of zero gradients would); the schedule still advances. Gradient norm 0."""
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": on purpose
            warnings.simplefilter("ignore", UserWarning)
            scheduler.step()
    model.eval()
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


@dataclass(frozen=True)
class Reference:
    """The frozen policy the KL term is measured against: a separate model, or the trained
    model itself with its LoRA adapter switched off."""

    model: Any
    disable_adapter: bool = False


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
