"""A real multi-node Ray cluster on this machine, started as a user starts one: ``ray start --head``
with no CPUs, then ``ray start --address`` once per worker node, each its own raylet with its own
CPUs, all on this machine, the head at 127.0.0.1 (``running_cluster``; Ray lists the nodes under
the address it finds for this machine). Each node runs in its own session, so that killing
the session (``kill``: SIGKILL to each of its processes) takes its raylet and every worker process
on it at once, as a lost machine.
What runs on it (``rollforge rollout``, ``rollforge train``) runs as the user's commands do, in
processes of their own (``start``). Used by ``test_node_loss.py`` (a rollout) and
``test_node_loss_training.py`` (training workers)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import psutil

from rollforge.cluster import connect
from rollforge.testing import free_port, wait_until

RAY = str(Path(sys.executable).parent / "ray")
COMMON = ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
COMMON += ["--object-store-memory", str(80 * 1024 * 1024)]


def environment() -> dict[str, str]:
    """A Ray user's shell: no auth token or usage stats (as rollforge's private instances), and
    without the single-node switch (``LOCAL_ENV``'s, which this process holds once the suite's
    private instance started), under which ``ray start --address`` refuses to join."""
    single = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
    own = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", single)}
    local = {key: value for key, value in connect.LOCAL_ENV.items() if key != single}
    return {**own, **local, "OMP_NUM_THREADS": "1"}


def start(command: list[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``command`` in a session of its own (killing it kills only what it started), with ``env``
    added to a Ray user's environment."""
    with log.open("w") as sink:
        return subprocess.Popen(
            command, env={**environment(), **(env or {})}, stdout=sink, stderr=sink, start_new_session=True
        )


def kill(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and everything in its session at once, as a machine that is lost (a
    node: its raylet and its worker processes, which Ray puts in process groups of their own)."""
    _signal_session(process, signal.SIGKILL)  # its processes, even when it ended before them
    process.wait()


def freeze(process: subprocess.Popen) -> None:
    """SIGSTOP everything in ``process``'s session, as a machine that drops off the network: its
    sockets stay open, so nothing on the other nodes hears a connection close (``kill`` ends it)."""
    _signal_session(process, signal.SIGSTOP)


def _signal_session(process: subprocess.Popen, number: int) -> None:
    for pid in psutil.pids():
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours
            if os.getsid(pid) == process.pid:
                os.kill(pid, number)


RESULT = "rollforge-test-result: "  # marks the one line a child prints for the test to read


def result_of(stdout: str):
    """The JSON a child process printed after ``RESULT``: Ray may print its own lines (a lagging
    heartbeat warning, say) before or after it on the same stdout."""
    marked = [line[len(RESULT) :] for line in stdout.splitlines() if line.startswith(RESULT)]
    assert marked, f"no line starting {RESULT!r} in: {stdout[-2000:]}"
    return json.loads(marked[-1])


def _ray_query(address: str, expression: str) -> subprocess.CompletedProcess:
    code = "import ray, sys, json; ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False); "
    code += f"print({RESULT!r} + json.dumps({expression}))"
    return subprocess.run([sys.executable, "-c", code, address], env=environment(), capture_output=True, text=True)


def alive_cpus(address: str) -> float:
    done = _ray_query(address, "sum(n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive'])")
    return float(result_of(done.stdout)) if done.returncode == 0 else -1.0


def worker_nodes(address: str) -> dict[str, str]:
    """The cluster's live nodes with CPUs (where actors that reserve CPUs run): node id -> IP."""
    expression = "{n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() "
    expression += "if n['Alive'] and n['Resources'].get('CPU', 0) > 0}"
    done = _ray_query(address, expression)
    assert done.returncode == 0, done.stderr[-2000:]
    return result_of(done.stdout)


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its address, its worker nodes' processes with their Ray node ids, and the
    address Ray lists each worker node under (``NodeManagerAddress``)."""

    address: str
    workers: list[subprocess.Popen]
    node_ids: list[str]  # workers[k] runs the node node_ids[k]
    hosts: dict[str, str]  # node id -> address


@contextlib.contextmanager
def running_cluster(tmp_path: Path, worker_cpus: int, head_env: Mapping[str, str] | None = None) -> Iterator[Cluster]:
    """A head with 0 CPUs at 127.0.0.1 (its processes given ``head_env`` too, the GCS's settings)
    and two worker nodes of ``worker_cpus`` CPUs each, stopped at the end. The machine's
    current-cluster file (which ``ray start --head`` writes) gets back what it held."""
    from ray._common.utils import get_ray_address_file

    marker = Path(get_ray_address_file(None))
    before = marker.read_text() if marker.exists() else None
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = start(
        [RAY, "start", "--head", "--port", str(port), "--num-cpus", "0", "--include-dashboard=false", *COMMON],
        tmp_path / "head.log",
        head_env,
    )
    workers: list[subprocess.Popen] = []
    node_ids: list[str] = []
    try:
        assert wait_until(lambda: head.poll() is not None or alive_cpus(address) == 0, timeout=180, interval=1)
        for k in range(2):  # one at a time: two raylets starting at once can time out on 2 loaded cores
            worker = [RAY, "start", "--address", address, "--num-cpus", str(worker_cpus), *COMMON]
            workers.append(start(worker, tmp_path / f"worker{k}.log"))
            joined = wait_until(lambda: alive_cpus(address) == (k + 1) * worker_cpus, timeout=180, interval=1)
            assert joined, (tmp_path / f"worker{k}.log").read_text()[-2000:]
            hosts = worker_nodes(address)
            node_ids += [node for node in hosts if node not in node_ids]
        yield Cluster(address, workers, node_ids, hosts)
    finally:
        for process in [*workers, head]:
            kill(process)
        if before is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(before)
