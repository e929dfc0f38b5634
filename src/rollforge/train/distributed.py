"""Training on several ranks: PyTorch's own machinery (torchrun, a process group, FSDP2), nothing home-made.

Launch: ``torchrun --nproc-per-node N -m rollforge train cfg.yaml`` (or ``rollforge train --nproc N``,
which runs exactly that). torchrun sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and the rendezvous;
``Ranks.open()`` joins the process group (gloo on CPU, NCCL on CUDA) and leaves it at the end. A
process not started by torchrun is one rank with no process group, and every collective below is
the identity, so the single-process trainer runs the same code.

How a step is divided:

- Every rank draws the same global batch of prompts (the prompt source is seeded identically) and
  rolls out its own contiguous share of whole GRPO groups (``batch_size`` must divide by the world
  size), so group advantages need no communication.
- The loss normaliser is global: the aggregation's token and sequence counts are summed over ranks
  (``Ranks.total``) and FSDP sums the gradients instead of averaging them, so the gradient equals
  the single-process gradient of the same batch.
- FSDP2 (``fully_shard`` on each decoder layer, then the root) shards parameters, gradients and
  optimizer state. Every FSDP forward and backward is a collective, so ranks run the same number of
  micro-batches (``Ranks.most``; a rank with fewer runs empty ones).
- Generation cannot run on sharded weights (each rank decodes its own episodes at its own pace), so
  each rank generates from a plain copy of the policy (``refresh_copy``; memory for one more
  copy of the weights) that receives the gathered full weights after every update; each rank's
  in-process backend (hf, vllm) loads them, servers every rank shares receive them from rank 0 alone.
- Metrics: rank 0 gathers every rank's trajectories, rewards and update statistics and computes the
  step's metrics over the global batch; only rank 0 writes the run directory's logs.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ..errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @staticmethod
    @contextlib.contextmanager
    def open(device: torch.device | None = None) -> Iterator["Ranks"]:
        """The ranks of this run: joins torchrun's process group when launched by torchrun (and
        leaves it on exit), else one rank."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            yield Ranks()
            return
        import torch.distributed as dist

        cuda = device is not None and device.type == "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if cuda:
            torch.cuda.set_device(local_rank)  # "cuda" is this rank's GPU from here on
        already = dist.is_initialized()
        if not already:
            dist.init_process_group("nccl" if cuda else "gloo")
        try:
            yield Ranks(dist.get_rank(), dist.get_world_size(), local_rank)
        finally:
            if not already:
                dist.destroy_process_group()

    def groups_per_rank(self, groups: int) -> int:
        """How many of ``groups`` (a batch's prompts) each rank rolls out; they must split evenly."""
        if groups % self.world:
            raise ConfigError(
                f"algorithm.batch_size={groups} prompts cannot be split evenly over {self.world} ranks: "
                f"use a multiple of {self.world}"
            )
        return groups // self.world

    def share(self, items: Sequence[Any], group_size: int) -> list[Any]:
        """This rank's contiguous share of a global batch of whole groups."""
        per_rank = self.groups_per_rank(len(items) // group_size) * group_size
        return list(items[self.rank * per_rank : (self.rank + 1) * per_rank])

    def total(self, value: float) -> float:
        """The sum of ``value`` over ranks."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def most(self, value: int) -> int:
        """The largest ``value`` of any rank."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None elsewhere."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    @contextlib.contextmanager
    def together(self, what: str) -> Iterator[None]:
        """A block that one rank may fail while the others wait (rank 0 writing files): every rank
        leaves it together. A failed rank raises its own error; the others raise ``CheckpointError``
        naming it, instead of waiting for it at the next collective until the process group times out."""
        failure: BaseException | None = None
        try:
            yield
        except BaseException as exc:  # KeyboardInterrupt too: the other ranks must hear of it
            failure = exc
        failed = self.most(self.rank + 1 if failure is not None else 0)
        if failure is not None:
            raise failure
        if failed:
            raise CheckpointError(f"rank {failed - 1} failed while {what}; rank {self.rank} stops with it")


def shard(model: Any, ranks: Ranks) -> Any:
    """FSDP2 over the ranks: each decoder layer is one unit, the root holds the rest (embeddings,
    final norm, the head). Gradients are summed across ranks, not averaged (the loss weights are
    already normalised over the global batch). One rank: the model unchanged."""
    return fully_shard_model(model) if ranks.distributed else model


def fully_shard_model(model: Any) -> Any:
    """``shard``'s FSDP2 wrapping whatever the world size (``bench gpu`` shards over a process
    group of one); the process group must be initialised."""
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for module in (*layers, model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no pre-multiplied sum)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _decoder_layers(model: Any) -> list[Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if callable(getattr(base, "get_decoder", None)) else None
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ConfigError(f"cannot shard {type(base).__name__} over ranks: its decoder has no 'layers' list of blocks")
    return list(layers)


def full_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights on every rank: a collective when the model is sharded."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def load_full_state_dict(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Put full weights into a model, sharded or not (each rank keeps its shard)."""
    if not is_sharded(model):
        model.load_state_dict(weights, strict=False)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))


def refresh_copy(copy: Any, policy: Any) -> None:
    """Load ``policy``'s full weights into ``copy``, the plain model this rank generates from (a
    sharded policy is gathered, every rank taking part; asynchronous training refreshes the HF
    backend's own copy the same way)."""
    weights = full_state_dict(policy)
    with torch.no_grad():
        copy.load_state_dict({k: v.detach() for k, v in weights.items()}, strict=False)
