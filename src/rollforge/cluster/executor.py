"""``executor: ray``: the same rollout, with every environment in a pool of Ray actors.

``environments_on_ray(task_to_env, config)`` connects to Ray (``connect.ensure_ray``) and gives a
``task_to_env`` of the same shape whose environments are ``RayEnvironmentPool``s; tasks that share
one environment object share one pool. The pools stop when the ``with`` block ends. The engine,
the trainer and the trajectories are unchanged: only where environment code runs differs.
Environments that run their own episodes (``GeneratingEnvironment``: agent programs behind the
gateway, which generates through the driver's backend) stay on the driver.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

from ..envs.base import Environment, GeneratingEnvironment
from .config import RayConfig
from .connect import ensure_ray
from .env_pool import RayEnvironmentPool
from .resources import ENV_ACTOR_KNOBS, Demand, check_fits, hold, share_cpus


def placed(task_to_env: Mapping[str, Environment], config: RayConfig | None):
    """The environments where they run: in Ray actor pools with a Ray ``config``, else as given."""
    if config is None:
        return contextlib.nullcontext(task_to_env)
    return environments_on_ray(task_to_env, config)


@contextlib.contextmanager
def environments_on_ray(task_to_env: Mapping[str, Environment], config: RayConfig) -> Iterator[dict[str, Environment]]:
    connect(config)
    distinct = {id(env): task for task, env in task_to_env.items() if not isinstance(env, GeneratingEnvironment)}
    actors = config.env_actors * len(distinct)
    cpus = share_cpus(config.env_actor_cpus, actors)
    demand = Demand("environment actors", actors, cpus, memory_mb=config.env_actor_memory_mb, knobs=ENV_ACTOR_KNOBS)
    check_fits(demand)
    pools: dict[int, RayEnvironmentPool] = {}
    release = hold(demand)
    try:
        for task, env in task_to_env.items():
            if id(env) in distinct and id(env) not in pools:
                pools[id(env)] = RayEnvironmentPool(
                    env,
                    actors=config.env_actors,
                    num_cpus=cpus,
                    memory_mb=config.env_actor_memory_mb,
                    name=task,
                )
        yield {task: pools.get(id(env), env) for task, env in task_to_env.items()}
    finally:
        for pool in pools.values():
            pool.shutdown()
        release()


def connect(config: RayConfig):
    return ensure_ray(config.address, num_cpus=config.num_cpus, object_store_mb=config.object_store_mb)
