"""Ray settings (``executor: ray``): closed, typed, documented next to each field. Importing this
module does not import Ray."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    address: str | None = None
    """Cluster to join: ``auto`` (the cluster this machine belongs to), ``ray://host:10001`` or
    ``host:6379``. None starts a private Ray instance on this machine, bound to 127.0.0.1, even when
    another Ray cluster runs here or ``RAY_ADDRESS`` names one (only ``auto`` reads it)."""
    env_actors: int = Field(2, ge=1)
    """Ray actors per environment; each holds many episodes at once, new episodes go to the actor
    holding the fewest."""
    env_actor_cpus: float | None = Field(None, ge=0)
    """CPUs Ray reserves for each environment actor (0: schedule regardless of free CPUs). None: 1
    on a cluster you joined; on the private local instance an equal share of its free CPUs (at
    most 1), so the defaults fit a laptop."""
    env_actor_memory_mb: int | None = Field(None, gt=0)
    """Memory Ray reserves for each environment actor (None: no reservation)."""
    generation_replicas: int = Field(1, ge=1)
    """Generation backend replicas on Ray actors behind a router (``hf`` and ``vllm`` backends),
    with each episode kept on one replica. 1: the backend runs in this process."""
    replica_cpus: float | None = Field(None, ge=0)
    """CPUs Ray reserves for each generation replica. None: as for ``env_actor_cpus``."""
    replica_gpus: float = Field(0.0, ge=0)
    """GPUs Ray reserves for each generation replica (a vLLM engine on a GPU node: 1)."""
    training_workers: int = Field(1, ge=1)
    """Training ranks on Ray actors forming one process group (FSDP2 over them, as under
    torchrun); 1: the trainer runs in this process."""
    training_worker_cpus: float | None = Field(None, gt=0)
    """CPUs Ray reserves for each training worker (its torch threads: the whole CPUs of it, at least
    1). None: 1 on a cluster you joined; on the private local instance an equal share of its free
    CPUs with the environment actors the workers start (at most 1), so the defaults fit a laptop."""
    training_worker_gpus: float = Field(0.0, ge=0)
    """GPUs Ray reserves for each training worker (1 on a GPU node)."""
    training_worker_placement: Literal["pack", "spread", "strict_spread"] = "pack"
    """Where Ray puts the training workers (a placement group's strategy): ``pack`` on as few nodes
    as hold them, ``spread`` over as many nodes as it can, ``strict_spread`` each on a node of its
    own (refused at once when fewer nodes can hold one)."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of a private local instance (None: all of this machine's)."""
    object_store_mb: int = Field(256, ge=75)
    """Object store size of a private local instance, in MiB."""
