"""The trainer's generation backend, described from the config sections that decide it.

``backend_config`` turns ``model`` (backend kind, model, server), ``rollout`` (concurrency),
``ray`` (replicas and what each reserves) and the run's ``executor``, ``seed`` and LoRA switch into
the ``BackendConfig`` that ``cluster.generation.open_generation`` opens:

- the engine computes in ``model.generation_dtype`` (default: the trainer's precision; autocast for ``hf``, the
  engine's dtype for ``vllm``), a colocated vLLM gets its sleep mode and memory share (``vllm``
  section), and a vLLM backend of a LoRA run loads each synced adapter as an adapter
  (``enable_lora``) instead of merging it;
- ``executor: ray`` runs ``ray.generation_replicas`` replicas (``hf``/``vllm`` on Ray actors);
  a local run has one;
- ``shared_model(config, model)`` is the trainer's model when one local replica can generate
  with that very object (the ``hf`` backend: no weight sync), else None.
"""

from __future__ import annotations

from typing import Any

from ..backends.config import BackendConfig
from ..cluster.config import RayConfig
from ..rollout.config import RolloutConfig
from .config import ModelConfig, VLLMConfig
from .policy import generation_dtype


def backend_config(
    model: ModelConfig,
    rollout: RolloutConfig,
    ray: RayConfig,
    executor: str,
    seed: int,
    lora_enabled: bool,
    vllm: VLLMConfig = VLLMConfig(),
) -> BackendConfig:
    """The training run's backend (see the module docstring)."""
    kind = model.backend
    dtype = generation_dtype(model)
    options: dict[str, Any] = {}
    if kind == "hf":
        options = {"compute_dtype": dtype}
    elif kind == "vllm":
        options = {**vllm.backend_options(dtype), **({"enable_lora": True} if lora_enabled else {})}
    return BackendConfig(
        kind=kind,
        model=model.name,
        base_url=model.base_url,
        served_model_name=model.served_model_name,
        concurrency=rollout.concurrency,
        seed=seed,
        options=options,
        replicas=ray.generation_replicas if executor == "ray" else 1,
        replica_cpus=ray.replica_cpus,
        replica_gpus=ray.replica_gpus,
    )


def shared_model(config: BackendConfig, model: Any) -> Any:
    """``model`` for ``open_generation(config, hf_model=...)`` when one replica in this process can
    share it, else None (replicas on Ray actors load their own copy)."""
    return model if config.replicas == 1 else None
