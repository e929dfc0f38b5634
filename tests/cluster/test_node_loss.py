"""A cluster that loses a node: ``rollforge rollout --executor ray`` on a real three-node Ray
cluster on this machine (a head with no CPUs and two worker nodes of one CPU each, each its own
raylet started with ``ray start``), one environment actor per worker node. Killing one worker
node's processes (SIGKILL, as a lost machine) mid-rollout fails only the episodes its actor held,
as infrastructure failures that run again; the actor's replacement cannot be placed (the cluster
lost the CPU it needs), so new episodes go to the surviving actor instead of waiting out the step
timeout on one that never starts, and the pool says so in one line. The kill waits on the event
(episodes written), not on a clock. Every trajectory names the worker node whose actor served it
(``served_by``), and ``metrics.json`` counts the episodes by node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollforge.cluster import connect
from rollforge.testing import free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

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


def start(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("w") as sink:  # its own session: killing its group kills only what it started
        return subprocess.Popen(command, env=environment(), stdout=sink, stderr=sink, start_new_session=True)


def alive_cpus(address: str) -> float:
    code = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False); "
    code += "print(sum(n['Resources'].get('CPU', 0) for n in ray.nodes() if n['Alive']))"
    done = subprocess.run([sys.executable, "-c", code, address], env=environment(), capture_output=True, text=True)
    return float(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else -1.0


def worker_nodes(address: str) -> dict[str, str]:
    """The cluster's live nodes with CPUs (where environment actors can run): node id -> IP."""
    code = "import ray, sys, json; ray.init(address=sys.argv[1], log_to_driver=False, configure_logging=False); "
    code += "print(json.dumps({n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() "
    code += "if n['Alive'] and n['Resources'].get('CPU', 0) > 0}))"
    done = subprocess.run([sys.executable, "-c", code, address], env=environment(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def cluster(tmp_path):
    """(address, worker processes): a head with 0 CPUs and two one-CPU worker nodes on 127.0.0.1.
    The machine's current-cluster file (which ``ray start --head`` writes) gets back what it held."""
    from ray._common.utils import get_ray_address_file

    marker = Path(get_ray_address_file(None))
    before = marker.read_text() if marker.exists() else None
    port = free_port()
    address = f"127.0.0.1:{port}"
    head = start(
        [RAY, "start", "--head", "--port", str(port), "--num-cpus", "0", "--include-dashboard=false", *COMMON],
        tmp_path / "head.log",
    )
    workers = []
    try:
        assert wait_until(lambda: head.poll() is not None or alive_cpus(address) == 0, timeout=180, interval=1)
        for k in range(2):  # one at a time: two raylets starting at once can time out on 2 loaded cores
            worker = [RAY, "start", "--address", address, "--num-cpus", "1", *COMMON]
            workers.append(start(worker, tmp_path / f"worker{k}.log"))
            joined = wait_until(lambda: alive_cpus(address) == k + 1, timeout=180, interval=1)
            assert joined, (tmp_path / f"worker{k}.log").read_text()[-2000:]
        yield address, workers
    finally:
        for process in [*workers, head]:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if before is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(before)


def test_a_lost_node_fails_only_its_episodes_and_the_rest_go_to_the_survivor(cluster, tiny_model_dir, tmp_path):
    address, workers = cluster
    nodes = worker_nodes(address)
    assert len(nodes) == 2, nodes
    out, episodes = tmp_path / "run", 2000
    command = [sys.executable, "-m", "rollforge", "rollout", "--model", str(tiny_model_dir), "--env", "guess_number"]
    command += ["--episodes", str(episodes), "--max-turns", "3", "--max-new-tokens", "4", "--out", str(out)]
    command += ["--executor", "ray", "--ray-address", address, "--env-actors", "2", "--env-actor-cpus", "1"]
    command += ["--step-timeout", "20", "--concurrency", "16", "--infra-retries", "2"]
    log = tmp_path / "rollout.log"
    rollout = start(command, log)
    partial = out / "trajectories.jsonl.partial"

    def written() -> int:
        return len(partial.read_text().splitlines()) if partial.exists() else 0

    try:
        assert wait_until(lambda: rollout.poll() is not None or written() >= 200, timeout=300, interval=0.1), (
            log.read_text()[-3000:]
        )
        assert rollout.poll() is None, log.read_text()[-3000:]  # still rolling out: the node dies mid-rollout
        os.killpg(workers[1].pid, signal.SIGKILL)  # the node's raylet, its actor and every worker process
        workers[1].wait()
        assert rollout.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if rollout.poll() is None:
            os.killpg(rollout.pid, signal.SIGKILL)
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == episodes  # nothing lost
    metrics = json.loads((out / "metrics.json").read_text())
    # the episodes the dead actor held (at most the 16 in flight) failed as infrastructure
    # failures and ran again on the survivor; no episode waited out the step timeout on the
    # replacement the cluster could not place
    assert 1 <= metrics["infra_retries"] <= 16 and metrics["infra_failures"] == 0, metrics
    assert "env_timeout" not in metrics["failures"], metrics
    assert "its replacement starts when the cluster can place it, and new episodes go to the 1 running actors" in (
        log.read_text()
    )
    # each episode names the actor that served it and that actor's node, one of the two workers
    # (both served episodes before the kill); the policy ran in the rollout's own process
    served = [t["served_by"] for t in trajectories]
    assert all(set(s) == {"environment"} and s["environment"]["node"] in nodes for s in served)
    assert all(s["environment"]["name"] in ("guess_number/0", "guess_number/1") for s in served)
    assert all(s["environment"]["host"] == nodes[s["environment"]["node"]] for s in served)
    by_node = metrics["episodes_by_node"]["environment"]
    assert set(by_node) == set(nodes) and sum(by_node.values()) == episodes, by_node
