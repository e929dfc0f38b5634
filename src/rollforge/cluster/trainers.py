"""Training ranks on Ray: ``ray.training_workers`` actors form one ``torch.distributed`` process group
and each runs the trainer as one rank, exactly as torchrun's processes would (``train/distributed.py``).

Ray places the workers: a placement group reserves ``training_worker_cpus`` CPUs and
``training_worker_gpus`` GPUs per worker, with the strategy ``training_worker_placement`` names
(``pack``: on one node when they fit, spread otherwise; ``spread``: over as many nodes as it can;
``strict_spread``: each on a node of its own, refused at once when fewer live nodes can hold one),
beside whatever the environments' actors and generation replicas that each worker starts reserve.
Before anything starts the driver decides all of those reservations together and checks that they
fit (``resources.sized_together``); the workers get the decided numbers. Each
worker learns its rank and the rendezvous (rank 0's node address and a free port there) from the
driver, sets the variables torchrun would set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and calls the entry point it was handed (``recipes/launch.py``
hands it one rank's run; this module imports nothing from ``train/`` or ``recipes/``); torch uses
as many threads as the worker reserved CPUs. A worker that sees GPUs sees only its own (Ray sets
``CUDA_VISIBLE_DEVICES``), so its local rank is 0. Each worker says once which node it runs on.

The driver watches every worker at once (``rank_watch.py``) and returns rank 0's result; a worker
that dies (its process killed, its node lost) stops the run: the other workers are killed, the
placement group removed, and one ``RollforgeError`` line names the lost rank's node and where the
run stopped (``stopped_at``, the caller's reader of the run directory), never after gloo's
30-minute timeout. A rollforge error raised in a worker (a refusal) is raised again on the driver
as it is. The run directory must be one that every node and the driver see (shared storage):
rank 0 writes the model and the metrics there, every rank its optimizer shard.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from ..errors import ConfigError, RollforgeError
from ..placement import Placement
from .connect import actor_death_reason, ensure_ray, this_node, worker_runtime_env
from .rank_watch import watch
from .resources import WORKER_KNOBS, sized_together

#: ``ray.training_worker_placement`` -> Ray's placement group strategy.
STRATEGIES = {"pack": "PACK", "spread": "SPREAD", "strict_spread": "STRICT_SPREAD"}


def train_on_ray(
    entry: Callable[..., Any],
    config: Any,
    kwargs: dict[str, Any],
    *,
    pooled_environments: int,
    stopped_at: Callable[[], str],
) -> Any:
    """``entry(config, **kwargs)`` on ``config.ray.training_workers`` Ray actors, each one rank; rank 0's
    result. ``pooled_environments``: how many environments each rank puts in actor pools (sized
    together with the workers). ``stopped_at()``: where the run stands, read from its directory
    when a worker is lost (the step it reached, what ``--resume`` continues from)."""
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
    check_spread(ray, settings.training_worker_placement, bundle, world)
    group = placement_group([bundle] * world, strategy=STRATEGIES[settings.training_worker_placement])
    try:
        if not _ready(ray, group, timeout=120):  # fits the cluster, but not what is free now
            raise ConfigError(
                f"Ray could not place {world} training workers of {bundle} each within 120 s: the cluster has "
                f"them, but other work holds them; lower {WORKER_KNOBS} or wait for that work to end"
            )
        return _run_ranks(ray, group, entry, config, kwargs, stopped_at)
    finally:
        remove_placement_group(group)


def check_spread(ray: Any, placement: str, bundle: dict[str, float], world: int) -> None:
    """Refuse ``strict_spread`` when fewer live nodes than ``world`` can hold a worker's ``bundle``
    (Ray would wait for nodes that never come)."""
    if placement != "strict_spread":
        return
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    able = sum(all(node.get(key, 0.0) >= amount for key, amount in bundle.items()) for node in nodes)
    if able < world:
        raise ConfigError(
            f"ray.training_worker_placement=strict_spread puts each of the {world} training workers on a node of "
            f"its own, but {able} live Ray nodes can hold one of {bundle}; lower ray.training_workers or set "
            "ray.training_worker_placement to spread or pack"
        )


def _run_ranks(
    ray: Any, group: Any, entry: Callable[..., Any], config: Any, kwargs: dict[str, Any], stopped_at: Callable[[], str]
) -> Any:
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
    where = _where(ray, _started(ray, ranks))
    address, port = ray.get(ranks[0].rendezvous.remote())
    threads = max(1, math.floor(settings.training_worker_cpus))
    runs = [r.run.remote(entry, config, rank, world, address, port, threads, kwargs) for rank, r in enumerate(ranks)]
    return watch(ray, ranks, where, runs, stopped_at)


def _started(ray: Any, ranks: list[Any], timeout: float = 120) -> list[tuple[str, str]]:
    """Each rank's (node id, address) once its actor runs; one line when one dies or does not start."""
    try:
        return ray.get([r.node.remote() for r in ranks], timeout=timeout)
    except ray.exceptions.RayActorError as exc:
        raise RollforgeError(f"a training worker died as it started: {actor_death_reason(exc)}") from None
    except ray.exceptions.GetTimeoutError:
        raise RollforgeError(f"the training workers were placed but did not start within {timeout:g} s") from None


def _where(ray: Any, nodes: list[tuple[str, str]]) -> list[Placement]:
    """Each rank's ``Placement``: its node id and the address Ray lists that node under (the
    worker's own view of its address when Ray lists none)."""
    listed = {node["NodeID"]: node.get("NodeManagerAddress") for node in ray.nodes()}
    return [
        Placement(f"training worker rank {rank}", node, listed.get(node) or ip) for rank, (node, ip) in enumerate(nodes)
    ]


def _ready(ray: Any, group: Any, timeout: float) -> bool:
    ready, _ = ray.wait([group.ready()], timeout=timeout)
    return bool(ready)


class _Rank:
    """One training rank in a Ray actor."""

    def node(self) -> tuple[str, str]:
        return this_node()

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
