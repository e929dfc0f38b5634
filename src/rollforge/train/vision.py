"""The update's log-probabilities for sequences that show images: each row is forwarded with the
pixel inputs of the images its ids hold, so the logits are the ones the backend sampled from.

A trajectory keeps its images on its messages (``Message.images``); a segment's ids render the
first ``Segment.messages`` of them (or its ``history``), so its images are those messages' images,
in order. ``with_images(row, processing, trajectory, segment)`` attaches them to the segment's
``UpdateRow`` as ``RowImages`` (the images and the processor's view of them,
``images.ImageProcessing``); the pixel inputs are computed when the row is forwarded, not kept.

An observation cut at ``max_seq_len`` may cut an image: its tokens are then no whole image, and no
processor output matches them. They come after every policy token of the episode (the cut ends
it), so no trained logprob depends on them: the row's ids hold the padding id in their place and
only the whole images are shown. Nothing changes for the trained tokens.

``batch_logprobs`` is ``logprobs.sequence_logprobs`` for a micro-batch whose rows carry no images
(shared prompt and all); a micro-batch with images runs row by row, each a full forward of the
model with its pixel inputs (``logits_to_keep`` from the row's first target), without the shared
prompt (whose cache a text-only decoder pass would compute without the images).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from ..images import ImageProcessing
from ..types import Segment, Trajectory
from .logprobs import picked_logprobs, sequence_logprobs


@dataclass(frozen=True)
class RowImages:
    """The images one update row shows, in order, and the processor's view of them."""

    processing: ImageProcessing
    images: tuple[Any, ...]

    def inputs(self, ids: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
        """The forward pass's pixel inputs for ``ids`` (the row's ids, unpadded) on ``device``."""
        return {k: v.to(device) for k, v in self.processing.inputs(ids, self.images).items()}


def segment_images(trajectory: Trajectory, segment: Segment) -> tuple[Any, ...]:
    """The images of the messages ``segment``'s ids render, in order."""
    messages = segment.history or trajectory.messages[: segment.messages]
    return tuple(image for message in messages for image in message.images)


def with_images(row: Any, processing: ImageProcessing | None, trajectory: Trajectory, segment: Segment) -> Any:
    """``row`` (an ``UpdateRow`` of ``segment``) with the images its ids show; as it is when there is
    no processor or no image."""
    images = segment_images(trajectory, segment) if processing is not None else ()
    if not images:
        return row
    shown, left = processing.whole_images(row.ids.tolist(), images)
    ids = row.ids
    if left:  # a cut image, after every policy token (see the module docstring)
        placeholders = torch.nonzero(ids == processing.placeholder_id).flatten()
        ids = ids.clone()
        ids[placeholders[len(placeholders) - left :]] = processing.processor.tokenizer.pad_token_id
    return replace(row, ids=ids, images=RowImages(processing, images[:shown]))


def batch_logprobs(
    model: Any, rows: Sequence[Any], ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor, prefix: int = 0
) -> torch.Tensor:
    """(B, T) logprobs of the target tokens of a micro-batch (``rows``: its ``UpdateRow``s, in the
    order of the collated ``ids``), images included (see the module docstring)."""
    if all(row.images is None for row in rows):
        return sequence_logprobs(model, ids, attention, targets, prefix)
    return torch.stack([_row_logprobs(model, row, ids[k], attention[k], targets[k]) for k, row in enumerate(rows)])


def _row_logprobs(
    model: Any, row: Any, ids: torch.Tensor, attention: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """(T,) logprobs of one row's target tokens; a full forward with its images."""
    out = torch.zeros(ids.shape[0], device=ids.device)
    n = int(attention.sum())
    cols = torch.nonzero(targets[1:n]).flatten()  # token cols + 1 is a target
    if cols.numel() == 0:
        return out
    first = int(cols.min())
    inputs = row.images.inputs(ids[:n].tolist(), ids.device) if row.images is not None else {}
    logits = model(input_ids=ids[None, :n], logits_to_keep=n - first, use_cache=False, **inputs).logits[0]
    out[cols + 1] = picked_logprobs(logits[cols - first], ids[cols + 1])
    return out
