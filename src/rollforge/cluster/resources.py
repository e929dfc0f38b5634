"""What actors reserve, sized to the cluster and checked against it before anything starts.

Two rules:

- **Defaults fit where a user starts.** A reservation left unset (``None``, the default of
  ``ray.env_actor_cpus``, ``ray.replica_cpus`` and ``ray.training_worker_cpus``) is one CPU per
  actor on a cluster the user joined, and an equal share of the instance's CPUs (at most one each)
  on the private instance rollforge started itself: a laptop with 2 cores runs two environments of
  two actors each (0.5 CPU per actor) instead of waiting for CPUs that will never come.
- **What cannot fit fails at once.** Before any actor starts, the reservations are compared with
  the cluster's totals (``ray.cluster_resources()``) and with its largest node: a request that can
  never be scheduled raises ``ConfigError`` naming the numbers and the key or flag that changes
  them, in milliseconds instead of after the start timeout. A request that fits the totals but not
  what is free right now still starts (other work may finish, an autoscaler may add nodes) and is
  bounded by the start timeout.
- **What this process already runs is counted.** Environment actors (for as long as their pools
  live) and generation replicas (until closed or collected) are *held* here (``hold``), and every
  later ``check_fits`` of this process adds them: environments started before replicas, or
  replicas before environments, are checked together.
- **Everything one run starts is counted together.** Training on Ray workers starts, from the
  driver's one decision, the workers, then in each worker its environments' actors (and its
  generation replicas): ``sized_together`` shares the unset reservations over all of those actors
  at once and checks them all in one ``check_fits``, then hands the workers explicit numbers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Callable

from ..errors import ConfigError
from .config import RayConfig
from .connect import import_ray, started_private

ENV_ACTOR_KNOBS = "ray.env_actor_cpus / --env-actor-cpus, ray.env_actor_memory_mb, ray.env_actors / --env-actors"
REPLICA_KNOBS = "ray.replica_cpus / --replica-cpus, ray.replica_gpus, ray.generation_replicas / --replicas"
WORKER_KNOBS = "ray.training_worker_cpus, ray.training_worker_gpus, ray.training_workers"


@dataclass(frozen=True)
class Demand:
    """``count`` actors of one kind, each reserving ``cpus``, ``gpus`` and ``memory_mb``.
    ``knobs`` names the config keys / flags that change the reservation, for the error message."""

    what: str
    count: int
    cpus: float
    gpus: float = 0.0
    memory_mb: int | None = None
    knobs: str = ""


def share_cpus(requested: float | None, actors: int, taken: float = 0.0) -> float:
    """The CPUs each of ``actors`` new actors reserves: ``requested`` when set; else one on a cluster
    the user joined, and an equal share of what the private instance has free (at most one), less
    ``taken``, what other actors starting with them reserve."""
    if requested is not None:
        return requested
    if actors < 1 or not started_private():
        return 1.0
    free = import_ray().available_resources().get("CPU", 0.0) - taken
    return max(0.0, min(1.0, math.floor(100 * free / actors) / 100))


def sized_together(settings: RayConfig, *, workers: int, environments: int, replicas: int) -> RayConfig:
    """``settings`` with every unset CPU reservation decided for ``workers`` training workers, each
    starting ``settings.env_actors`` actors for each of its ``environments`` pooled environments
    and ``replicas`` generation replicas: one equal share over all of those actors (``share_cpus``).
    Raise ``ConfigError`` when they cannot all fit together (``check_fits``)."""
    env_actors = workers * environments * settings.env_actors
    counts = {"training_worker_cpus": workers, "env_actor_cpus": env_actors, "replica_cpus": workers * replicas}
    unset = [key for key in counts if getattr(settings, key) is None]
    taken = sum(n * getattr(settings, key) for key, n in counts.items() if key not in unset)
    share = share_cpus(None, sum(counts[key] for key in unset), taken)
    sized = settings.model_copy(update={key: share for key in unset})
    if workers and not sized.training_worker_cpus and not sized.training_worker_gpus:  # Ray places no empty bundle
        raise ConfigError(
            f"the environment actors and replicas reserve {_fmt(taken)} CPUs, all that the private Ray instance has free, "
            f"and leave none for the {workers} training workers; lower {ENV_ACTOR_KNOBS} or set ray.training_worker_cpus"
        )
    check_fits(
        Demand("training workers", workers, sized.training_worker_cpus, sized.training_worker_gpus, knobs=WORKER_KNOBS),
        Demand(
            "environment actors",
            env_actors,
            sized.env_actor_cpus,
            memory_mb=sized.env_actor_memory_mb,
            knobs=ENV_ACTOR_KNOBS,
        ),
        Demand("generation replicas", workers * replicas, sized.replica_cpus, sized.replica_gpus, knobs=REPLICA_KNOBS),
    )
    return sized


def hold(demand: Demand) -> Callable[[], None]:
    """Count ``demand`` (actors now running) in this process's later ``check_fits`` until the
    returned function is called (they stopped); calling it again does nothing."""
    token = next(_TOKENS)
    _HELD[token] = demand

    def release() -> None:
        _HELD.pop(token, None)

    return release


_HELD: dict[int, Demand] = {}  # what this process's running actors reserve
_TOKENS = itertools.count()


def check_fits(*demands: Demand) -> None:
    """Raise ``ConfigError`` when ``demands``, with what this process holds, can never be scheduled
    on this cluster."""
    counts: dict[Demand, int] = {}  # equal actors counted as one kind: "3 hf replicas x 1"
    for demand in (*_HELD.values(), *demands):
        kind = dataclasses.replace(demand, count=0)
        counts[kind] = counts.get(kind, 0) + demand.count
    demands = tuple(dataclasses.replace(kind, count=n) for kind, n in counts.items())
    ray = import_ray()
    totals = ray.cluster_resources()
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    for resource, unit, per_actor in (
        ("CPU", "CPUs", _cpus),
        ("GPU", "GPUs", _gpus),
        ("memory", "MiB of memory", _memory),
    ):
        wanted = [(d, per_actor(d)) for d in demands if d.count and per_actor(d) > 0]
        if not wanted:
            continue
        have = totals.get(resource, 0.0) / (1024 * 1024 if resource == "memory" else 1)
        largest = max((n.get(resource, 0.0) for n in nodes), default=0.0) / (1024 * 1024 if resource == "memory" else 1)
        total = sum(d.count * amount for d, amount in wanted)
        for demand, amount in wanted:
            if amount > largest + 1e-9:
                raise ConfigError(
                    f"each of the {demand.what} reserves {_fmt(amount)} {unit} but the largest Ray node has "
                    f"{_fmt(largest)}; lower it with {demand.knobs}"
                )
        if total > have + 1e-9:
            parts = ", ".join(f"{d.count} {d.what} x {_fmt(a)}" for d, a in wanted)
            knobs = "; ".join(d.knobs for d, _ in wanted)
            raise ConfigError(
                f"the actors reserve {_fmt(total)} {unit} ({parts}) but the Ray cluster has {_fmt(have)}; "
                f"lower the reservations or the actor counts: {knobs}"
            )


def _cpus(demand: Demand) -> float:
    return demand.cpus


def _gpus(demand: Demand) -> float:
    return demand.gpus


def _memory(demand: Demand) -> float:
    return float(demand.memory_mb or 0)


def _fmt(value: float) -> str:
    return f"{value:g}"
