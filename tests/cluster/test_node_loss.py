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
import sys

import pytest

from rollforge.testing import wait_until

from multinode import running_cluster, start, worker_nodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def cluster(tmp_path):
    """(address, worker node processes): a head with 0 CPUs and two one-CPU worker nodes."""
    with running_cluster(tmp_path, worker_cpus=1) as running:
        yield running.address, running.workers


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
