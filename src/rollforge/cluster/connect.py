"""Connecting to Ray: a running cluster (``auto``, ``ray://host:port``, ``host:port``) or, with no
address, a private Ray instance started on this machine's loopback interface.

A cluster is joined only when asked: with no address, ``ray.init`` receives ``address="local"``,
which starts a new instance even when another Ray cluster runs on this machine (Ray's own default
would join the latest one, found in ``/tmp/ray/ray_current_cluster``, or the one ``RAY_ADDRESS``
names, and then refuse the private instance's sizes). ``RAY_ADDRESS`` is read only with ``auto``.

A local instance is started with ``RAY_AUTH_MODE=disabled`` only when the user has not set it, with
usage statistics off, no dashboard, a bounded object store, and every Ray process bound to
127.0.0.1 (Ray otherwise picks the address of the first network interface).
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import sys
import sysconfig
from typing import Any

from ..errors import ConfigError, MissingDependency


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependency("ray", "ray", "executor: ray") from None
    return ray


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None, object_store_mb: int = 256) -> Any:
    """Connect to Ray once per process and return the ``ray`` module. An already initialised Ray
    (a test fixture, the user's own ``ray.init``) is used as it is."""
    if not address:
        for key, value in LOCAL_ENV.items():  # read by Ray when it is imported
            os.environ.setdefault(key, value)
    ray = import_ray()
    if ray.is_initialized():
        return ray
    arguments = init_arguments(address, num_cpus=num_cpus, object_store_mb=object_store_mb)
    if address:
        try:
            ray.init(**arguments)
        except ConnectionError as exc:
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {exc}") from None
        return ray
    from ray._private import ray_constants

    # Ray reads this one at import; when it was imported before (by the user, by a library), its
    # "bind to the first interface" default would put a private instance on the network.
    ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] not in ("0", "false", "False")
    global _PRIVATE
    ray.init(**arguments)
    _PRIVATE = True
    return ray


def init_arguments(address: str | None, *, num_cpus: int | None = None, object_store_mb: int = 256) -> dict[str, Any]:
    """What ``ray.init`` receives: the given address alone (a cluster sizes itself), or with none a
    new private instance (``address="local"``) of the given size, on 127.0.0.1, whatever else runs."""
    if address is not None and not isinstance(address, str):
        raise ConfigError(f"ray address must be a string such as 'auto' or 'ray://host:10001', got {address!r}")
    quiet = {"log_to_driver": False, "configure_logging": False}
    if address:
        return {"address": address, **quiet}
    if object_store_mb < 75:
        raise ConfigError(f"object_store_mb must be >= 75 (Ray's minimum), got {object_store_mb}")
    return {
        "address": "local",
        "num_cpus": num_cpus,
        "object_store_memory": object_store_mb * 1024 * 1024,
        "include_dashboard": False,
        "_node_ip_address": "127.0.0.1",
        **quiet,
    }


def started_private() -> bool:
    """Whether the Ray this process uses is a private instance that ``ensure_ray`` started (and
    nothing else uses), rather than a cluster the user joined or initialised themselves."""
    return _PRIVATE and import_ray().is_initialized()


_PRIVATE = False

#: Environment of a local instance: no auth token on loopback, no usage reports, and Ray's
#: "single machine" address resolution (127.0.0.1 instead of the first interface's address).
LOCAL_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


def worker_runtime_env() -> dict[str, Any]:
    """What Ray workers need to unpickle the user's environments and backends: this process's
    ``sys.path`` (the user's project, a test directory), and the code of modules that no path can
    import (a ``file.py:attr`` environment loaded from a file) shipped by value."""
    from ray import cloudpickle

    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if not file or "." in name or name == "__main__" or file.startswith(_INSTALLED):
            continue
        if importlib.machinery.PathFinder.find_spec(name, sys.path) is None:
            cloudpickle.register_pickle_by_value(module)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}


_INSTALLED = tuple({sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def actor_death_reason(exc: Exception) -> str:
    """Ray's reason for an actor's death, short: its "died because" line and, when the actor's
    constructor raised, that error's last line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Ray colours the actor's name
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    why = [line for line in lines if "died because" in line.lower() or "dead because" in line.lower()]
    errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    return " ".join(why[:1] + errors[-1:]) or (lines[0] if lines else type(exc).__name__)


def this_node() -> tuple[str, str]:
    """(node id in hex, node IP address) of the Ray worker that calls it: what an actor's
    ``ready()`` answers, so the driver knows where it runs (``placement.py``)."""
    ray = import_ray()
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
