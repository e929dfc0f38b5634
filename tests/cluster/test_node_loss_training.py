"""A training run that loses a node: ``rollforge train --executor ray --ray-address ADDR`` on a
real three-node Ray cluster on this machine (``multinode.py``: a head with no CPUs and two worker
nodes of two CPUs each, each its own raylet), with two training workers spread over the two worker
nodes (``ray.training_worker_placement=strict_spread``) and a checkpoint every step.

Once step 2's checkpoint is in place (the test polls the run directory's ``checkpoints/latest``:
an event, not a clock), one worker node is killed (SIGKILL to its raylet and every worker process
on it, as a lost machine). The run stops within a bound, whatever gloo's timeout, with one line
naming the lost rank's node and the step the run reached, exit status 2 and no traceback. Once the
cluster lists the node as gone, ``--resume`` with the same two workers, packed onto the surviving
node, trains from the last checkpoint to the end: every step recorded once, on two ranks.

A node that goes silent instead (SIGSTOP to its processes: no socket closes, so the surviving rank
blocks in its collective for gloo's 30 minutes) stops the run once Ray's health checks declare the
node dead, sped up here from Ray's minute to seconds (``FAST_HEALTH_CHECKS``)."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from rollforge.testing import first_character_rows, wait_until

from multinode import freeze, kill, running_cluster, start, worker_nodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, KILL_AFTER = 6, 2


def _config(tmp_path: Path, tiny_model_dir: Path) -> Path:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in first_character_rows(64)))
    config = {
        "model": {"name": str(tiny_model_dir)},
        "data": {"path": str(data)},
        "out": str(tmp_path / "run"),
        "steps": STEPS,
        "seed": 1,
        "environments": [{"name": "rollforge.testing:FirstCharacter", "task_name": "first"}],
        "algorithm": {"batch_size": 4, "group_size": 4},
        "rollout": {"max_new_tokens": 2, "max_turns": 1},
        "optim": {"lr": 1e-3},
        "checkpoint_every": 1,
        "save_trajectories": False,
        "executor": "ray",
        "ray": {"env_actors": 1, "env_actor_cpus": 0, "training_workers": 2, "training_worker_cpus": 1},
    }
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(config))
    return path


def _latest_step(out: Path) -> int:
    pointer = out / "checkpoints" / "latest"
    named = pointer.read_text().strip() if pointer.is_file() else ""
    return int(named.removeprefix("step-")) if named.startswith("step-") else 0


@dataclass(frozen=True)
class Stopped:
    """What the run that lost a node left: its one error line, the last step its metrics record,
    and the step of its last checkpoint."""

    error: str
    reached: int
    checkpoint: int


def _train_and_lose_node(cluster, command: list[str], out: Path, log: Path, lose: Callable, within: float) -> Stopped:
    """Train with the two workers on the two worker nodes; once step ``KILL_AFTER`` is checkpointed,
    ``lose`` the second worker node; the run must stop within ``within`` seconds, exit status 2, with
    one error line and no traceback."""
    run = start([*command, "--set", "ray.training_worker_placement=strict_spread"], log)
    try:
        checkpointed = wait_until(lambda: run.poll() is not None or _latest_step(out) >= KILL_AFTER, 300, 0.05)
        assert checkpointed and run.poll() is None, log.read_text()[-3000:]
        lose(cluster.workers[1])  # a worker node, with the training rank it held
        assert run.wait(timeout=within) == 2, log.read_text()[-3000:]
    finally:
        kill(run)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("rollforge: error:")]
    assert len(errors) == 1, text[-3000:]
    reached = max(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines())
    checkpoint = _latest_step(out)
    assert KILL_AFTER <= checkpoint <= reached < STEPS
    return Stopped(errors[0], reached, checkpoint)


def _expected_error(cluster, out: Path, stopped: Stopped, reason: str) -> str:
    lost = cluster.node_ids[1]
    checkpoint = repr(str(out / "checkpoints" / f"step-{stopped.checkpoint:06d}"))
    return (
        rf"rollforge: error: training worker rank [01] on Ray node {lost[:8]} \({re.escape(cluster.hosts[lost])}\) "
        rf"was lost \({reason}\); the run stopped after step {stopped.reached}; --resume continues after step "
        rf"{stopped.checkpoint} \(checkpoint {re.escape(checkpoint)}\); on fewer nodes, set ray\.training_workers "
        r"to what they hold"
    )


def test_a_killed_node_stops_training_in_one_line_and_resume_finishes_on_the_survivor(tiny_model_dir, tmp_path):
    config, out = _config(tmp_path, tiny_model_dir), tmp_path / "run"
    with running_cluster(tmp_path, worker_cpus=2) as cluster:
        command = [sys.executable, "-m", "rollforge", "train", str(config), "--ray-address", cluster.address]
        stopped = _train_and_lose_node(cluster, command, out, tmp_path / "train.log", kill, within=120)
        # the survivor's collective fails at once (the dead rank's sockets closed); the rank reported is the lost one
        assert re.fullmatch(_expected_error(cluster, out, stopped, r"[^;]+"), stopped.error), stopped.error

        # the node is gone for the cluster too; the same two workers fit the survivor's two CPUs
        survivor = {cluster.node_ids[0]: cluster.hosts[cluster.node_ids[0]]}
        assert wait_until(lambda: worker_nodes(cluster.address) == survivor, timeout=120, interval=1)
        log = tmp_path / "resume.log"
        resumed = start([*command, "--resume"], log)  # placement: pack, the default
        try:
            assert resumed.wait(timeout=300) == 0, log.read_text()[-3000:]
        finally:
            kill(resumed)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # the steps after the checkpoint, once
    assert all(r["ranks"] == 2 for r in records)
    assert _latest_step(out) == STEPS
    trained = rf"trained {STEPS - stopped.checkpoint} steps? \({stopped.checkpoint + 1}-{STEPS}\)"
    assert re.search(trained, log.read_text()), log.read_text()[-3000:]


#: The head's health checks of the nodes, faster than Ray's defaults (every 3 s, 10 s to answer, dead
#: after 5 misses: about a minute), so that a silent node is declared dead in seconds.
FAST_HEALTH_CHECKS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "4",
}


def test_a_silent_node_stops_training_on_rays_health_checks_not_gloos_timeout(tiny_model_dir, tmp_path):
    """A node that drops off the network closes no socket: the surviving rank blocks in its
    collective (gloo's timeout is 30 minutes). The driver stops the run once Ray declares the node
    dead."""
    config, out = _config(tmp_path, tiny_model_dir), tmp_path / "run"
    with running_cluster(tmp_path, worker_cpus=2, head_env=FAST_HEALTH_CHECKS) as cluster:
        command = [sys.executable, "-m", "rollforge", "train", str(config), "--ray-address", cluster.address]
        stopped = _train_and_lose_node(cluster, command, out, tmp_path / "train.log", freeze, within=90)
        reason = "the actor died because its node has died"
        assert re.fullmatch(_expected_error(cluster, out, stopped, reason), stopped.error), stopped.error
