"""Hugging Face backend for vision-language models: image-text models (``AutoModelForImageTextToText``:
Qwen2-VL / Qwen2.5-VL, SmolVLM / Idefics3, ...) that see the images of the conversation.

``HFVisionBackend`` declares ``accepts_images``: the engine passes ``generate(prompt_ids, params,
images=...)`` every image of the conversation so far, in order (the user prompt's and every tool
result's), each turn. The prompt ids already hold each image's tokens, expanded as the processor
expands them (``chat/vision.py``); the backend checks that the ids show exactly those images whole
and adds their pixel inputs (``images.ImageProcessing.inputs``) to the prefill.

Design: one worker thread runs one request at a time, a prefill over the whole prompt with its
images, then one forward per token with the model's own KV cache (no batching across requests:
the text backend's running batch keeps 1-D positions per row, which a Qwen-VL model's 3-D RoPE
does not have). Sampling is ``sampling.sample`` with uniforms pre-drawn per request
(``draw_uniforms``), as in ``HFBackend``: the same seed gives the same tokens, and the stored
logprob of a token is that of the raw logits. Stop tokens, stop strings and the budget end a
request as in ``HFBackend``; a request whose caller went away stops at its next token. The ids
that stand for images and videos (``ImageProcessing.reserved_ids``) are never sampled: a model
cannot write an image, and one it wrote would show no image the processor could expand (the
stored logprobs stay those of the raw logits, as under top-k).

A Qwen-VL model keeps the M-RoPE offset of the sequence it last prefilled on the model
(``rope_deltas``) and reads it at every decode step; a forward of another sequence in between (the
update, on a shared model) would change it. Each request therefore clears it before its prefill and
puts its own back before each decode step.

Settings (``HFSettings``): ``seed``, ``num_threads`` and ``compute_dtype`` apply; the batching,
prefix-cache and CPU-attention settings belong to the text backend and are ignored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
from typing import Any, Sequence

import torch

from ..arguments import check_model
from ..errors import BackendError, ContextExceeded
from ..images import ImageProcessing
from ..types import Completion, FinishReason
from .base import Backend, SamplingParams, StopStrings
from .hf_batch import prompt_problem
from .sampling import RowSampling, draw_uniforms, sample
from .settings import HFSettings


class HFVisionBackend(Backend):
    """Generation with a transformers image-text ``model`` and its ``processor`` (see the module
    docstring). Call ``close()`` when done."""

    accepts_images = True

    def __init__(self, model: Any, processor: Any, settings: HFSettings = HFSettings()):
        check_model(model, "HFVisionBackend")
        if getattr(processor, "image_processor", None) is None:
            raise BackendError(
                f"HFVisionBackend needs the model's processor with an image processor, got {type(processor).__name__}"
            )
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.images = ImageProcessing(processor)
        self.settings = settings
        self._device = next(model.parameters()).device
        dtype = settings.compute_dtype
        self._autocast = dtype if dtype not in (None, next(model.parameters()).dtype) else None
        self._max_positions = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
        self._vocab_size: int = model.get_input_embeddings().num_embeddings
        eos = self.tokenizer.eos_token_id
        self._eos_ids = frozenset(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        self._seeds = random.Random(settings.seed)
        self._reserved = torch.tensor(sorted(self.images.reserved_ids), dtype=torch.long, device=self._device)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollforge-hf-vision")
        self._closed = False

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[Any] = ()
    ) -> Completion:
        if self._closed:
            raise BackendError("the HF vision backend is closed")
        gone = threading.Event()
        job = self._worker.submit(self._complete, tuple(map(int, prompt_ids)), params, tuple(images), gone)
        try:
            return await asyncio.wrap_future(job)
        finally:
            gone.set()  # a cancelled caller: the worker stops at the next token

    async def close(self) -> None:
        self._closed = True
        await asyncio.to_thread(self._worker.shutdown, wait=True)

    def shares_model(self, model: Any) -> bool:
        return self.model is model

    # --- worker ------------------------------------------------------------------------------

    def _complete(
        self, ids: tuple[int, ...], params: SamplingParams, images: tuple[Any, ...], gone: threading.Event
    ) -> Completion:
        problem = prompt_problem(ids, self._max_positions, self._vocab_size)
        if problem is not None:
            too_long = self._max_positions is not None and len(ids) >= self._max_positions
            raise (ContextExceeded if too_long else BackendError)(problem)  # too long: the episode's own fault
        if (problem := self._image_problem(ids, images)) is not None:
            raise BackendError(problem)
        if self.settings.num_threads is not None:
            torch.set_num_threads(self.settings.num_threads)
        budget = params.max_new_tokens
        if self._max_positions is not None:
            budget = min(budget, self._max_positions - len(ids))
        uniforms = draw_uniforms([params], [budget], self._seeds, self._device)  # (1, budget)
        sampling = RowSampling.from_params([params], self._device)
        stop_ids = frozenset(params.stop_token_ids) if params.stop_token_ids else self._eos_ids
        stops = StopStrings(self.tokenizer.decode, params.stop)
        mixed = torch.autocast(self._device.type, self._autocast) if self._autocast else contextlib.nullcontext()
        with torch.inference_mode(), mixed:
            inputs = {k: v.to(self._device) for k, v in self.images.inputs(ids, images).items()}
            decoding = _Decoding(self.model, ids, inputs, self._device)
            tokens: list[int] = []
            logprobs: list[float] = []
            while True:
                logits = decoding.logits  # (1, V)
                token, _ = sample(logits.index_fill(1, self._reserved, -torch.inf), uniforms[:, len(tokens)], sampling)
                tokens.append(int(token))
                logprobs.append(float(torch.log_softmax(logits.float(), dim=-1)[0, token]))
                reason = _finished(tokens, budget, stop_ids, stops, gone)
                if reason is not None:
                    return Completion(tuple(tokens), tuple(logprobs), reason)
                decoding.step(token)

    def _image_problem(self, ids: tuple[int, ...], images: tuple[Any, ...]) -> str | None:
        """Why ``ids`` do not show exactly ``images`` whole, in order; None when they do."""
        shown, left = self.images.whole_images(ids, images)
        if shown == len(images) and not left:
            return None
        held = list(ids).count(self.images.placeholder_id)
        needed = sum(self.images.tokens(image) for image in images)
        return (
            f"the prompt holds {held} image tokens but its {len(images)} images take {needed}; render the "
            "prompt with the model's processor (rollforge.chat.vision.VisionRenderer)"
        )


class _Decoding:
    """One request's forward passes: the prefill over the prompt with its image ``inputs``, then
    one token at a time over the model's own KV cache; ``logits`` (1, V) predicts the next token."""

    def __init__(self, model: Any, ids: tuple[int, ...], inputs: dict[str, Any], device: torch.device):
        self.model = model
        self._owner = getattr(model, "model", None)  # Qwen-VL: where rope_deltas lives (see the docstring)
        self._keeps_rope = hasattr(self._owner, "rope_deltas")
        if self._keeps_rope:
            self._owner.rope_deltas = None
        prompt = torch.tensor([ids], dtype=torch.long, device=device)
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1, **inputs)
        self._rope = self._owner.rope_deltas if self._keeps_rope else None
        self._cache = out.past_key_values
        self.logits = out.logits[:, -1]

    def step(self, token: torch.Tensor) -> None:
        if self._keeps_rope:
            self._owner.rope_deltas = self._rope
        out = self.model(input_ids=token.view(1, 1), past_key_values=self._cache, use_cache=True)
        self._cache = out.past_key_values
        self.logits = out.logits[:, -1]


def _finished(
    tokens: list[int], budget: int, stop_ids: frozenset[int], stops: StopStrings, gone: threading.Event
) -> FinishReason | None:
    if tokens[-1] in stop_ids or stops.completed_by_last(tokens):
        return "stop"
    if len(tokens) >= budget:
        return "length"
    if gone.is_set():
        return "abort"
    return None
