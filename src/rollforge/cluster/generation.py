"""Where generation runs: in this process, or on replicas on Ray actors.

``open_generation(config, hf_model=..., tokenizer=...)`` is what commands and the trainer call to
get their backend. With ``config.replicas == 1`` (or the ``openai`` backend, whose replicas are its
servers) it is ``backends.opening.open_backend``: the backend runs here. ``hf``/``vllm`` with
``replicas > 1`` start that many Ray actors (``cluster/replicas.py``; a local Ray instance is
started unless one is connected), each loading the model itself, behind a ``RouterBackend`` that
keeps each episode on one replica and places new episodes on the least-loaded one.

This choice lives in ``cluster/``, above ``backends/``: backends never import Ray code. The result
is an async context manager: ``async with open_generation(config) as backend:`` closes it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..backends.base import Backend
from ..backends.config import BackendConfig
from ..backends.opening import open_backend
from ..errors import ConfigError


def open_generation(
    config: BackendConfig, *, hf_model: Any = None, tokenizer: Any = None, processor: Any = None
) -> Backend:
    """The backend ``config`` describes, here or on ``config.replicas`` Ray actors (see the module
    docstring). ``hf_model`` (the trainer's model object) can only be shared by one local replica;
    ``tokenizer`` and ``processor`` (an image-text model's) are used by a local one."""
    if config.kind == "openai" or config.replicas == 1:
        return open_backend(config, hf_model=hf_model, tokenizer=tokenizer, processor=processor)
    if hf_model is not None:
        raise ConfigError(
            f"hf_model cannot be shared by {config.replicas} replicas on Ray actors: each loads the model from "
            f"{config.model!r} itself; pass hf_model=None or replicas=1"
        )
    from ..backends.router import RouterBackend
    from ..models import resolve_model
    from .connect import ensure_ray
    from .replicas import start_replicas

    ensure_ray()
    return RouterBackend(start_replicas(dataclasses.replace(config, model=str(resolve_model(config.model)))))
