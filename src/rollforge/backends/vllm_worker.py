"""Code that runs inside vLLM's worker processes: the weight-sync entry point.

vLLM mixes the class named by its ``worker_extension_cls`` option into every worker, and its
methods become callable by name through ``collective_rpc`` (in-process: ``AsyncLLM.collective_rpc``;
on a server started with ``--worker-extension-cls`` and ``VLLM_SERVER_DEV_MODE=1``: ``POST
/collective_rpc``). This module must stay importable without rollforge's heavy dependencies: it
is imported by the worker, by qualified name.

Why not call vLLM's ``reload_weights`` alone: it reloads layer by layer and re-runs each layer's
post-load processing, but a tied output head (``lm_head`` sharing the embedding, as in SmolLM2 and
Qwen2.5-0.5B) loads no weight of its own, so its post-load processing is skipped. On CPU that
processing builds a prepacked copy of the weight for the GEMM kernel, so the head would keep
computing logits with the old weights. ``rollforge_reload_weights`` re-runs it for output heads.
(vLLM still logs "ParallelLMHead: Failed to load weights" and the same for the rotary embedding,
which has no weights; both are expected.)
"""

from __future__ import annotations

from typing import Any

#: The value to pass as vLLM's ``worker_extension_cls`` (``--worker-extension-cls`` for ``vllm serve``).
WORKER_EXTENSION = "rollforge.backends.vllm_worker.WeightSyncExtension"


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker)."""

    def rollforge_reload_weights(self, weights_path: str) -> int:
        """Reload every weight in place from ``weights_path`` (a directory of safetensors with
        Hugging Face names); return how many output heads were re-processed."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        worker: Any = self
        worker.reload_weights(weights_path=str(weights_path))
        heads = [m for m in worker.model_runner.get_model().modules() if isinstance(m, ParallelLMHead)]
        for head in heads:
            method = getattr(head, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(head)
        return len(heads)
