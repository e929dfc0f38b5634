"""Watching training ranks on Ray (``cluster/rank_watch.py``) and the line a lost rank ends the run
with: which rank, on which node, where the run stopped (read from the run directory by
``recipes/launch.py``'s ``where_it_stopped``). The message, the run-directory reading and the
``strict_spread`` check are plain functions; the watch runs stand-in ranks (``ray_ranks.py``) on
the session's Ray instance, marked slow as every Ray test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollforge.cluster.connect import worker_runtime_env
from rollforge.cluster.rank_watch import dead, death_reason, lost_rank_message, watch
from rollforge.cluster.trainers import check_spread
from rollforge.errors import ConfigError, RollforgeError
from rollforge.placement import Placement
from rollforge.recipes.launch import where_it_stopped

NODE_A, NODE_B = "6626f448d9a85c593ee9a99a6c6261979364813a3ca664a882daa19c", "82edc5c07b114e21f6b7d9a94a0b5f74c9e9f5cd"
WHERE = [
    Placement("training worker rank 0", NODE_A, "10.0.0.7"),
    Placement("training worker rank 1", NODE_B, "10.0.0.8"),
]


def test_a_lost_rank_is_one_line_naming_its_node_and_where_the_run_stopped():
    stopped = (
        "the run stopped after step 3; --resume continues after step 3 (checkpoint 'runs/x/checkpoints/step-000003')"
    )
    assert lost_rank_message(WHERE[1], "its connection closed:\n the worker process or its node is gone", stopped) == (
        "training worker rank 1 on Ray node 82edc5c0 (10.0.0.8) was lost (its connection closed: the worker process "
        "or its node is gone); the run stopped after step 3; --resume continues after step 3 (checkpoint "
        "'runs/x/checkpoints/step-000003'); on fewer nodes, set ray.training_workers to what they hold"
    )


def test_what_ray_reports_of_a_lost_rank_is_told_apart_from_the_ranks_own_error_and_shortened():
    ray = pytest.importorskip("ray")
    closed = ray.exceptions.ActorUnavailableError("RpcError: RPC error: Socket closed rpc_code: 14", None)
    memory = ray.exceptions.OutOfMemoryError(
        "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
        "800e19b7) was 22.41GB used / 23.54GB limit (0.952105)\nOOM kill reason: Memory usage exceeded threshold"
    )
    raised = ray.exceptions.RayTaskError("run", "Traceback ...", RuntimeError("Connection reset by peer"))
    assert dead(ray, closed) and dead(ray, memory) and not dead(ray, raised)
    assert death_reason(ray, closed) == "its connection closed: the worker process or its node is gone"
    assert death_reason(ray, memory) == "1 worker(s) were killed due to the node running low on memory"


def _checkpoint(out: Path, step: int) -> None:
    directory = out / "checkpoints" / f"step-{step:06d}"
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(json.dumps({"step": step}))
    (out / "checkpoints" / "latest").write_text(directory.name + "\n")


def test_where_a_run_stopped_is_read_from_its_metrics_and_its_latest_checkpoint(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    assert where_it_stopped(out) == "the run stopped before its first step ended; nothing was recorded: run it again"
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in (1, 2, 3, 4)))
    assert where_it_stopped(out) == (
        "the run stopped after step 4; no checkpoint was written yet: start over with --overwrite"
    )
    _checkpoint(out, 2)
    _checkpoint(out, 4)
    (out / "checkpoints" / "latest").write_text("step-000002\n")  # step 4's was being written: not named yet
    assert where_it_stopped(out) == (
        f"the run stopped after step 4; --resume continues after step 2 (checkpoint "
        f"{str(out / 'checkpoints' / 'step-000002')!r})"
    )


class _Cluster:
    """What ``check_spread`` reads of Ray: the nodes."""

    def __init__(self, *nodes: dict):
        self._nodes = list(nodes)

    def nodes(self) -> list[dict]:
        return self._nodes


def test_strict_spread_is_refused_at_once_when_fewer_nodes_can_hold_a_worker():
    ray = _Cluster(
        {"Alive": True, "Resources": {"CPU": 0.0}},  # the head
        {"Alive": True, "Resources": {"CPU": 2.0}},
        {"Alive": False, "Resources": {"CPU": 2.0}},  # a lost node
    )
    with pytest.raises(ConfigError) as caught:
        check_spread(ray, "strict_spread", {"CPU": 1.0}, 2)
    assert str(caught.value) == (
        "ray.training_worker_placement=strict_spread puts each of the 2 training workers on a node of its own, but "
        "1 live Ray nodes can hold one of {'CPU': 1.0}; lower ray.training_workers or set "
        "ray.training_worker_placement to spread or pack"
    )
    check_spread(ray, "strict_spread", {"CPU": 1.0}, 1)
    check_spread(ray, "pack", {"CPU": 1.0}, 2)  # packed or spread, Ray places them on what there is
    check_spread(ray, "spread", {"CPU": 1.0}, 2)


# -- the watch, on Ray actors ------------------------------------------------------------------------


@pytest.fixture
def ranks(ray_session):
    """``start()``: two stand-in rank actors that reserve no CPU."""
    from ray_ranks import Rank

    def start() -> list:
        actor = ray_session.remote(Rank).options(num_cpus=0, runtime_env=worker_runtime_env())
        return [actor.remote(), actor.remote()]

    return start


def _all_ended(ray, runs) -> bool:
    done, _ = ray.wait(list(runs), num_returns=len(runs), timeout=0)
    return len(done) == len(runs)


def _stopped() -> str:
    return "the run stopped after step 3; --resume continues after step 3"


@pytest.mark.slow
def test_every_rank_ending_well_gives_rank_0s_result(ray_session, ranks):
    actors = ranks()
    runs = [actors[0].result.remote("rank 0's"), actors[1].result.remote("rank 1's")]
    assert watch(ray_session, actors, WHERE, runs, _stopped) == "rank 0's"


@pytest.mark.slow
def test_a_rank_that_dies_stops_the_blocked_one_and_is_named(ray_session, ranks):
    actors = ranks()
    runs = [actors[0].block.remote(), actors[1].exit.remote()]
    with pytest.raises(RollforgeError) as caught:
        watch(ray_session, actors, WHERE, runs, _stopped)
    assert type(caught.value) is RollforgeError
    message = str(caught.value)
    assert message.startswith("training worker rank 1 on Ray node 82edc5c0 (10.0.0.8) was lost (")
    assert message.endswith(
        "); the run stopped after step 3; --resume continues after step 3; on fewer nodes, set ray.training_workers "
        "to what they hold"
    )
    assert "\n" not in message
    assert _all_ended(ray_session, runs)  # the blocked rank was killed before the run directory was read
    with pytest.raises(ray_session.exceptions.RayActorError):
        ray_session.get(runs[0])


@pytest.mark.slow
def test_a_peers_collective_error_does_not_hide_the_rank_that_died(ray_session, ranks, tmp_path):
    actors, signal = ranks(), str(tmp_path / "rank-0-failed")
    runs = [actors[0].fail_announcing.remote(signal), actors[1].exit_after.remote(signal)]
    with pytest.raises(RollforgeError, match=r"^training worker rank 1 on Ray node 82edc5c0 \(10\.0\.0\.8\) was lost"):
        watch(ray_session, actors, WHERE, runs, _stopped)


@pytest.mark.slow
def test_a_refusal_in_a_rank_is_raised_as_it_is_and_the_others_stopped(ray_session, ranks):
    actors = ranks()
    runs = [actors[0].refuse.remote(), actors[1].block.remote()]
    with pytest.raises(ConfigError, match=r"^algorithm\.batch_size=3 must be a multiple of the 2 ranks$"):
        watch(ray_session, actors, WHERE, runs, _stopped, notice=120)  # a refusal waits for no death
    assert _all_ended(ray_session, runs)


@pytest.mark.slow
def test_an_error_with_no_death_behind_it_is_raised_once_the_notice_passed(ray_session, ranks):
    actors = ranks()
    runs = [actors[0].block.remote(), actors[1].fail.remote()]
    with pytest.raises(ValueError, match="a bug in the rank"):
        watch(ray_session, actors, WHERE, runs, _stopped, notice=1.0)
    assert _all_ended(ray_session, runs)
