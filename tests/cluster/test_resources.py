"""Reservations on Ray: the defaults fit the 2-CPU private instance a user starts on, and what can
never fit fails before any actor is started (none waits to be placed) with the numbers and the knob
that changes them."""

from __future__ import annotations

import json

import pytest

from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.cli.main import main
from rollforge.cluster.config import RayConfig
from rollforge.cluster import executor
from rollforge.cluster.executor import environments_on_ray
from rollforge.cluster.resources import Demand, check_fits, share_cpus
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.models import load_tokenizer

from test_cli import from_record


def test_unset_reservations_share_the_private_instance(ray_session):
    assert ray_session.cluster_resources()["CPU"] == 2
    assert share_cpus(None, 4) == 0.5  # two environments x two actors on two CPUs
    assert share_cpus(None, 1) == 1.0  # never more than one CPU each
    assert share_cpus(0.25, 4) == 0.25  # an explicit value is kept


def test_what_can_never_fit_fails_at_once_naming_numbers_and_knobs(ray_session, monkeypatch):
    pools = []  # environment actor pools started: a refusal after one would wait for placement
    monkeypatch.setattr(executor, "RayEnvironmentPool", lambda *args, **kwargs: pools.append(args))
    env = get_env_spec("echo").build()
    with pytest.raises(ConfigError) as error:
        with environments_on_ray({"echo": env}, RayConfig(env_actors=3, env_actor_cpus=1.0)):
            pass
    message = str(error.value)
    assert pools == []
    assert "reserve 3 CPUs (3 environment actors x 1) but the Ray cluster has 2" in message
    assert "--env-actor-cpus" in message and "--env-actors" in message
    with pytest.raises(
        ConfigError, match=r"reserves 4 CPUs but the largest Ray node has 2; lower it with ray.replica_cpus"
    ):
        check_fits(Demand("hf replicas", 1, 4.0, knobs="ray.replica_cpus / --replica-cpus"))
    with pytest.raises(ConfigError, match="GPUs"):
        check_fits(Demand("vllm replicas", 1, 0.0, gpus=1.0, knobs="ray.replica_gpus"))
    check_fits(Demand("environment actors", 4, 0.5))  # exactly the instance: fits


@pytest.mark.slow
def test_laptop_command_succeeds_with_defaults(ray_cpus_free, smollm2_dir, tmp_path):
    """The README's first Ray command, with no reservation flags, on the 2-CPU loopback instance."""
    out = tmp_path / "ray"
    args = [
        "rollout",
        "--model",
        str(smollm2_dir),
        "--executor",
        "ray",
        "--env",
        "arithmetic",
        "--env",
        "catch",
        "--episodes",
        "8",
        "--max-turns",
        "4",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["task_name"] for r in records] == ["arithmetic", "catch"] * 4
    assert all(r["error"] is None for r in records), [r["error"] for r in records]
    renderer = ChatRenderer(load_tokenizer(str(smollm2_dir)))
    for record in records:
        assert token_fidelity_gap(from_record(record), renderer) is None
    ray_cpus_free()  # every actor stopped and released its share (asserted at once, it failed once: 1.5 of 2)


def test_agent_programs_stay_on_the_driver_beside_pooled_environments(ray_session):
    """``executor: ray`` with an agent program: the agent environment is not shipped to actors (it
    generates through the driver's backend); the others are pooled."""
    from rollforge.cluster.env_pool import RayEnvironmentPool
    from rollforge.gateway import AgentEnvironment

    agent, echo = AgentEnvironment(lambda base_url, row: 1.0), get_env_spec("echo").build()
    with environments_on_ray({"agent": agent, "echo": echo}, RayConfig(env_actors=2)) as placed:
        assert placed["agent"] is agent
        assert isinstance(placed["echo"], RayEnvironmentPool)


class _FakeRay:
    """What ``check_fits`` and ``share_cpus`` read of Ray: one node of ``cpus`` CPUs, ``free`` of them free."""

    def __init__(self, cpus: float, free: float | None = None):
        self.cpus, self.free = cpus, cpus if free is None else free

    def cluster_resources(self):
        return {"CPU": self.cpus}

    def available_resources(self):
        return {"CPU": self.free}

    def nodes(self):
        return [{"Alive": True, "Resources": {"CPU": self.cpus}}]


@pytest.fixture
def fake_ray(monkeypatch):
    from rollforge.cluster import resources

    def install(cpus: float, *, private: bool, free: float | None = None):
        monkeypatch.setattr(resources, "import_ray", lambda: _FakeRay(cpus, free))
        monkeypatch.setattr(resources, "started_private", lambda: private)

    return install


def test_training_workers_and_their_environment_actors_share_a_private_instance(fake_ray):
    from rollforge.cluster.resources import sized_together

    fake_ray(2, private=True)
    # the README's laptop line: 2 workers, each with 2 actors of one environment = 6 actors on 2 CPUs,
    # floor(100 * 2 / 6) / 100 = 0.33 each, 6 x 0.33 = 1.98 <= 2
    sized = sized_together(RayConfig(), workers=2, environments=1, replicas=0)
    assert (sized.training_worker_cpus, sized.env_actor_cpus) == (0.33, 0.33)
    # workers set to 1 CPU each take both CPUs: what is left for the 4 actors is 0 each
    sized = sized_together(RayConfig(training_worker_cpus=1), workers=2, environments=1, replicas=0)
    assert (sized.training_worker_cpus, sized.env_actor_cpus) == (1, 0)
    # 1 worker, 2 environments x 3 actors, 2 replicas on 4 CPUs with 1 free: 9 actors, 0.11 each
    fake_ray(4, private=True, free=1)
    sized = sized_together(RayConfig(env_actors=3), workers=1, environments=2, replicas=2)
    assert (sized.training_worker_cpus, sized.env_actor_cpus, sized.replica_cpus) == (0.11, 0.11, 0.11)


def test_the_fit_check_counts_workers_environment_actors_and_replicas_together(fake_ray):
    from rollforge.cluster.resources import sized_together

    fake_ray(8, private=False)  # a joined cluster: 1 CPU per unset reservation
    sized = sized_together(RayConfig(), workers=2, environments=1, replicas=0)  # 2 + 2 x 2 = 6 <= 8
    assert (sized.training_worker_cpus, sized.env_actor_cpus) == (1, 1)
    with pytest.raises(ConfigError) as error:  # 2 workers + 4 actors + 2 x 2 replicas = 10 > 8
        sized_together(RayConfig(generation_replicas=2), workers=2, environments=1, replicas=2)
    message = str(error.value)
    assert (
        "the actors reserve 10 CPUs (2 training workers x 1, 4 environment actors x 1, 4 generation replicas x 1)"
        " but the Ray cluster has 8"
    ) in message
    assert "ray.training_worker_cpus" in message and "ray.env_actor_cpus" in message and "ray.replica_cpus" in message
    fake_ray(2, private=True)  # explicit numbers are kept and counted: 2 x 1 + 4 x 0.5 = 4 > 2
    with pytest.raises(ConfigError, match=r"reserve 4 CPUs \(2 training workers x 1, 4 environment actors x 0.5\)"):
        sized_together(RayConfig(training_worker_cpus=1, env_actor_cpus=0.5), workers=2, environments=1, replicas=0)


def test_what_this_process_runs_is_counted_until_it_stops(fake_ray):
    from rollforge.cluster.resources import hold

    fake_ray(4, private=False)
    release = hold(Demand("environment actors", 2, 1.0, knobs="ray.env_actor_cpus"))
    try:
        # replicas started after the environments: 2 x 1 + 3 x 1 = 5 > 4 (each alone would fit)
        with pytest.raises(
            ConfigError,
            match=r"reserve 5 CPUs \(2 environment actors x 1, 3 hf replicas x 1\) but the "
            r"Ray cluster has 4; .*ray.env_actor_cpus; ray.replica_cpus",
        ):
            check_fits(Demand("hf replicas", 3, 1.0, knobs="ray.replica_cpus"))
        check_fits(Demand("hf replicas", 2, 1.0))
    finally:
        release()
    release()  # a second call does nothing
    check_fits(Demand("hf replicas", 4, 1.0))  # the environments stopped: all four CPUs are there


def test_environment_pools_hold_their_reservation_while_they_live(ray_session):
    env = get_env_spec("echo").build()
    with environments_on_ray({"echo": env}, RayConfig(env_actors=2, env_actor_cpus=0.5)):
        with pytest.raises(ConfigError, match=r"reserve 2.5 CPUs \(2 environment actors x 0.5, 2 hf replicas x 0.75\)"):
            check_fits(Demand("hf replicas", 2, 0.75))
    check_fits(Demand("hf replicas", 2, 0.75))


def test_training_workers_left_without_a_cpu_are_refused(fake_ray):
    from rollforge.cluster.resources import sized_together

    fake_ray(2, private=True)  # 4 actors x 0.5 take both CPUs: a worker's share would be 0, an empty Ray bundle
    with pytest.raises(
        ConfigError,
        match=r"reserve 2 CPUs, all that the private Ray instance has free, and leave none "
        r"for the 2 training workers",
    ):
        sized_together(RayConfig(env_actor_cpus=0.5), workers=2, environments=1, replicas=0)
