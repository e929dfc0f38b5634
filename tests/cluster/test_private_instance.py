"""A private Ray instance is private: with no address rollforge starts a new local instance even
beside a running cluster (``ray start --head``, the machine's "current cluster") or a ``RAY_ADDRESS``
naming one, and joins a cluster only when an address is given (``auto`` or the cluster's own).

The decision is checked on ``connect.init_arguments`` (what ``ray.init`` receives) and on
``ensure_ray`` with a recording ``ray``; the slow test runs ``rollforge rollout --executor ray`` in
a subprocess beside a real head started for it, and checks the head never saw the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollforge.cluster import connect
from rollforge.errors import ConfigError
from rollforge.testing import free_port, wait_until

from multinode import RESULT, result_of

QUIET = {"log_to_driver": False, "configure_logging": False}
PRIVATE = {
    "address": "local",  # a new instance, never the machine's current cluster or RAY_ADDRESS's
    "num_cpus": 2,
    "object_store_memory": 96 * 1024 * 1024,
    "include_dashboard": False,
    "_node_ip_address": "127.0.0.1",
    **QUIET,
}


@pytest.mark.parametrize("address", [None, ""])
def test_no_address_starts_a_new_local_instance(address):
    assert connect.init_arguments(address, num_cpus=2, object_store_mb=96) == PRIVATE


@pytest.mark.parametrize("address", ["auto", "ray://head:10001", "10.0.0.5:6379"])
def test_an_address_joins_that_cluster_without_sizes(address):
    # a joined cluster has its own sizes: Ray refuses num_cpus and object_store_memory there
    assert connect.init_arguments(address, num_cpus=2, object_store_mb=96) == {"address": address, **QUIET}


def test_bad_address_and_store_size_are_named():
    with pytest.raises(ConfigError, match="ray address must be a string.*6379"):
        connect.init_arguments(6379)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="object_store_mb must be >= 75.*got 10"):
        connect.init_arguments(None, object_store_mb=10)


@pytest.mark.parametrize("address", [None, "auto"])
def test_ensure_ray_hands_ray_init_those_arguments(address, monkeypatch):
    calls = []
    fake = SimpleNamespace(is_initialized=lambda: bool(calls), init=lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(connect, "import_ray", lambda: fake)
    monkeypatch.setattr(connect, "_PRIVATE", False)  # restored afterwards
    for key in connect.LOCAL_ENV:
        monkeypatch.delenv(key, raising=False)  # restored afterwards; ensure_ray sets them for a private run
    assert connect.ensure_ray(address, num_cpus=2, object_store_mb=96) is fake
    assert calls == [connect.init_arguments(address, num_cpus=2, object_store_mb=96)]
    assert connect.started_private() is (address is None)  # what sizes the actors to a private instance


ROLLOUT = (
    f"RESULT = {RESULT!r}\n"
    + """
import json, os, sys
from rollforge.cli.main import main
code = main(sys.argv[1:])
import ray
from rollforge.cluster.connect import started_private
gcs = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
print(RESULT + json.dumps({"code": code, "pid": os.getpid(), "private": started_private(), "gcs": gcs}))
"""
)

INSPECT = (
    f"RESULT = {RESULT!r}\n"
    + """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False)
nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]
drivers = [j["DriverPid"] for j in ray._private.state.jobs()]
print(RESULT + json.dumps({"nodes": nodes, "cpus": ray.cluster_resources().get("CPU"), "drivers": drivers}))
"""
)


def user_environment() -> dict[str, str]:
    """This shell's environment without ``RAY_ADDRESS`` (a test adds it when it means to)."""
    return {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}


def head_environment() -> dict[str, str]:
    return {**user_environment(), **connect.LOCAL_ENV}  # no auth token, no usage stats, bound to 127.0.0.1


@pytest.fixture(scope="module")
def running_head(tmp_path_factory):
    """A Ray cluster started as a user starts one (``ray start --head``), on 127.0.0.1 with one CPU,
    and the machine's current cluster while the tests run. Only this head is stopped (``--block``
    ends its processes on SIGTERM; no ``ray stop``, which would end every Ray on the machine), and
    the current-cluster file gets back what it held."""
    from ray._common.utils import get_ray_address_file

    port = free_port()
    address = f"127.0.0.1:{port}"
    marker = Path(get_ray_address_file(None))
    before = marker.read_text() if marker.exists() else None
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    command = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--disable-usage-stats"]
    command += ["--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", "1"]
    command += ["--include-dashboard=false", "--object-store-memory", str(80 * 1024 * 1024)]
    with log.open("w") as sink:
        head = subprocess.Popen(command, env=head_environment(), stdout=sink, stderr=sink, start_new_session=True)

    def current() -> bool:
        return marker.exists() and marker.read_text().strip().endswith(f":{port}")

    try:
        wait_until(lambda: head.poll() is not None or current(), timeout=180, interval=0.2)
        assert head.poll() is None and current(), log.read_text()[-3000:]
        assert marker.read_text().strip() == address, log.read_text()[-3000:]
        yield address
    finally:
        stop_head(head)
        if current() and before is None:
            marker.unlink()
        elif current():
            marker.write_text(before)


def stop_head(head: subprocess.Popen) -> None:
    head.terminate()
    try:
        head.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)  # its own session: only the processes this test started
        head.wait()


def run_python(code: str, *args: str, env: dict[str, str]) -> dict:
    command = [sys.executable, "-c", code, *args]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return result_of(done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("ray_address_set", [False, True], ids=["current-cluster", "RAY_ADDRESS"])
def test_a_rollout_beside_a_running_cluster_starts_its_own(running_head, ray_address_set, tiny_model_dir, tmp_path):
    env = user_environment()
    if ray_address_set:
        env["RAY_ADDRESS"] = running_head  # a Ray user's shell; a private run still stays private
    out = tmp_path / "run"
    args = ["rollout", "--model", str(tiny_model_dir), "--env", "arithmetic", "--episodes", "2", "--max-turns", "1"]
    args += ["--max-new-tokens", "4", "--out", str(out), "--executor", "ray", "--env-actors", "1"]
    run = run_python(ROLLOUT, *args, env=env)
    assert run["code"] == 0 and run["private"]
    assert run["gcs"].startswith("127.0.0.1:") and run["gcs"] != running_head
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2
    head = run_python(INSPECT, running_head, env=head_environment())
    assert head["nodes"] == ["127.0.0.1"] and head["cpus"] == 1
    assert run["pid"] not in head["drivers"]  # the rollout never connected to the head


@pytest.mark.slow
def test_the_suite_instance_is_private_beside_a_running_cluster(running_head, ray_session):
    # last in this file, so the rollouts' instances are gone; when this file runs first in a session,
    # conftest's ray_session starts here, beside the head
    assert ray_session.get_runtime_context().gcs_address != running_head
    assert ray_session.cluster_resources().get("CPU") == 2  # the fixture's size, not the head's 1
