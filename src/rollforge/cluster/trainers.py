"""Training ranks on Ray: ``ray.training_workers`` actors form one ``torch.distributed`` process group
and each runs the trainer as one rank, exactly as torchrun's processes would (``train/distributed.py``).

Ray places the workers: a placement group reserves ``training_worker_cpus`` CPUs and
``training_worker_gpus`` GPUs per worker (strategy PACK: on one node when they fit, spread
otherwise), beside whatever the environments' actors and generation replicas that each worker
starts reserve. Before anything starts the driver decides all of those reservations together and
checks that they fit (``resources.sized_together``); the workers get the decided numbers. Each
worker learns its rank and the rendezvous (rank 0's node address and a free port there) from the
driver, sets the variables torchrun would set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and calls the entry point it was handed (``recipes/launch.py``
hands it one rank's run; this module imports nothing from ``train/`` or ``recipes/``); torch uses
as many threads as the worker reserved CPUs. A worker that sees GPUs sees only its own (Ray sets
``CUDA_VISIBLE_DEVICES``), so its local rank is 0. The driver waits for every worker, returns rank
0's result and removes the placement group; a worker that dies fails the run with Ray's reason, and
a rollforge error raised in a worker (a refusal) is raised again on the driver as it is.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from ..errors import ConfigError, RollforgeError
from .connect import actor_death_reason, ensure_ray, worker_runtime_env
from .resources import WORKER_KNOBS, sized_together


def train_on_ray(entry: Callable[..., Any], config: Any, kwargs: dict[str, Any], *, pooled_environments: int) -> Any:
    """``entry(config, **kwargs)`` on ``config.ray.training_workers`` Ray actors, each one rank; rank 0's
    result. ``pooled_environments``: how many environments each rank puts in actor pools (sized
    together with the workers)."""
    settings = config.ray
    ray = ensure_ray(settings.address, num_cpus=settings.num_cpus, object_store_mb=settings.object_store_mb)
    from ray.util.placement_group import placement_group, remove_placement_group

    world = settings.training_workers
    replicas = settings.generation_replicas if settings.generation_replicas > 1 else 0
    settings = sized_together(settings, workers=world, environments=pooled_environments, replicas=replicas)
    config = config.model_copy(update={"ray": settings})  # the workers reserve what was decided here
    bundle = {
        "CPU": settings.training_worker_cpus,
        **({"GPU": settings.training_worker_gpus} if settings.training_worker_gpus else {}),
    }
    group = placement_group([bundle] * world, strategy="PACK")
    try:
        if not _ready(ray, group, timeout=120):  # fits the cluster, but not what is free now
            raise ConfigError(
                f"Ray could not place {world} training workers of {bundle} each within 120 s: the cluster has "
                f"them, but other work holds them; lower {WORKER_KNOBS} or wait for that work to end"
            )
        return _run_ranks(ray, group, entry, config, kwargs)
    finally:
        remove_placement_group(group)


def _run_ranks(ray: Any, group: Any, entry: Callable[..., Any], config: Any, kwargs: dict[str, Any]) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    settings, world = config.ray, config.ray.training_workers
    worker, runtime_env = ray.remote(_Rank), worker_runtime_env()
    ranks = [
        worker.options(
            num_cpus=settings.training_worker_cpus,
            num_gpus=settings.training_worker_gpus,
            runtime_env=runtime_env,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
        ).remote()
        for i in range(world)
    ]
    address, port = ray.get(ranks[0].rendezvous.remote())
    threads = max(1, math.floor(settings.training_worker_cpus))
    runs = [r.run.remote(entry, config, rank, world, address, port, threads, kwargs) for rank, r in enumerate(ranks)]
    try:
        return ray.get(runs)[0]
    except ray.exceptions.RayActorError as exc:
        raise RollforgeError(f"a training worker died: {actor_death_reason(exc)}") from None
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, RollforgeError):  # a refusal in a rank: the same one line as in one process
            raise exc.cause from None
        raise


def _ready(ray: Any, group: Any, timeout: float) -> bool:
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    return bool(ready)


class _Rank:
    """One training rank in a Ray actor."""

    def rendezvous(self) -> tuple[str, int]:
        import ray

        from ..ports import free_port

        address = ray.util.get_node_ip_address()
        return address, free_port(address)

    def run(
        self,
        entry: Callable[..., Any],
        config: Any,
        rank: int,
        world: int,
        address: str,
        port: int,
        threads: int,
        kwargs: dict[str, Any],
    ) -> Any:
        import torch

        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR=address,
            MASTER_PORT=str(port),
            RAY_TRAINING_RANK=str(rank),
        )
        torch.set_num_threads(threads)
        return entry(config, **kwargs)
