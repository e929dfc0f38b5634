"""``EngineWorkers``: engine worker processes started once that serve many rollouts, each sent only
its shard; the same trajectories as one process; a dead worker started again; nothing left behind."""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import signal

import pytest
from test_engine_workers import Marks, comparable_fields, counting_setup, worker_children, workers_config

from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import ConfigError
from rollforge.rollout import engine_workers, worker_pool
from rollforge.rollout.engine import arollout, rollout
from rollforge.rollout.worker_channel import dumps
from rollforge.rollout.worker_pool import EngineWorkers
from rollforge.testing import HANG_SECONDS, until, wait_until


def _steps(samples):
    """Two rollouts as a training run does them: other samples, indices counting on."""
    return [(samples[:6], workers_config(first_index=0, seed=1)), (samples[6:], workers_config(first_index=6, seed=2))]


def test_two_rollouts_on_one_pool_match_one_process_and_keep_their_workers(tiny_model_dir):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 12)
    before = worker_children()
    alone = [rollout(part, envs, backend, renderer, config) for part, config in _steps(samples)]
    with EngineWorkers(2, envs, backend, renderer) as pool:
        pids = pool.pids
        assert worker_children() - before == set(pids)
        pooled = []
        for part, config in _steps(samples):  # each rollout on its own event loop (the sync face)
            pooled.append(rollout(part, envs, backend, renderer, config, workers=pool))
            assert pool.pids == pids
    for one, two in zip(alone, pooled):
        assert [comparable_fields(t) for t in two.trajectories] == [comparable_fields(t) for t in one.trajectories]
        assert two.metrics["errors"] == {} and two.metrics["total_turns"] == one.metrics["total_turns"] > 0
    assert [t.index for t in pooled[1].trajectories] == list(range(6, 12))
    first, second = (result.metrics["engine_worker_start_cpu_seconds"] for result in pooled)
    assert all(cpu > 0 for cpu in first) and second == [None, None]  # the start counted once
    assert worker_children() == before


def test_a_rollout_on_a_pool_sends_its_shard_and_not_the_setup(tiny_model_dir, monkeypatch):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 12)
    sent: list[int] = []

    def pickled(payload, setting):
        sent.append(len(blob := original(payload, setting)))
        return blob

    original = worker_pool.pickled
    monkeypatch.setattr(worker_pool, "pickled", pickled)
    monkeypatch.setattr(engine_workers, "pickled", pickled)
    tokenizer = len(dumps(renderer.tokenizer))

    async def two_rollouts():
        async with EngineWorkers(2, envs, backend, renderer) as pool:
            (setup,) = sent  # one setup for every worker, pickled once
            assert setup > tokenizer and pool.setups_sent == 2
            for part, config in _steps(samples):
                del sent[:]
                await arollout(part, envs, backend, renderer, config, workers=pool)
                assert len(sent) == 2 and all(size < tokenizer for size in sent)  # two shards, no tokenizer
            assert pool.setups_sent == 2

    asyncio.run(two_rollouts())


def test_a_worker_killed_between_rollouts_is_started_again(tiny_model_dir, caplog):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 12)
    (part, config), (later, later_config) = _steps(samples)
    alone = rollout(later, envs, backend, renderer, later_config)
    before = worker_children()
    with EngineWorkers(2, envs, backend, renderer) as pool:
        rollout(part, envs, backend, renderer, config, workers=pool)
        kept, killed = pool.pids
        os.kill(killed, signal.SIGKILL)
        assert wait_until(lambda: _exited(killed))
        with caplog.at_level(logging.WARNING, logger="rollforge.rollout.worker_pool"):
            result = rollout(later, envs, backend, renderer, later_config, workers=pool)
        assert pool.pids[0] == kept and pool.pids[1] != killed and pool.setups_sent == 3
        assert f"engine worker 1 (pid {killed}) exited with code -9; starting it again" in caplog.text
        assert [comparable_fields(t) for t in result.trajectories] == [comparable_fields(t) for t in alone.trajectories]
        assert result.metrics["engine_worker_start_cpu_seconds"][0] is None  # only the new one started
        assert result.metrics["engine_worker_start_cpu_seconds"][1] > 0
    assert worker_children() == before


def _exited(pid: int) -> bool:
    """Exited and ready to be reaped, left for the pool to reap (a killed process's zombie may not be
    reapable yet while its other threads exit)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def test_a_rollout_that_raises_closes_the_pool_and_a_later_one_is_refused(tiny_model_dir):
    # itemgetter raises TypeError with no frame of anyone else's code: a rollforge bug, raised as it is
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 4, script=operator.itemgetter(5))
    before = worker_children()
    pool = EngineWorkers(2, envs, backend, renderer)
    with pool:
        with pytest.raises(TypeError):
            rollout(samples, envs, backend, renderer, workers_config(), workers=pool)
        assert worker_children() == before  # every worker terminated at once
        with pytest.raises(ConfigError) as caught:
            rollout(samples, envs, backend, renderer, workers_config(), workers=pool)
    assert "\n" not in str(caught.value) and "not open" in str(caught.value)
    assert worker_children() == before


def test_cancelling_a_rollout_on_a_pool_terminates_its_workers(tiny_model_dir, tmp_path):
    generating = tmp_path / "generating"
    samples, envs, slow, renderer = counting_setup(tiny_model_dir, 6, script=Marks(generating), latency=30.0)
    before = worker_children()

    async def cancelled() -> None:
        async with EngineWorkers(2, envs, slow, renderer) as pool:
            task = asyncio.ensure_future(arollout(samples, envs, slow, renderer, workers_config(), workers=pool))
            assert await until(generating.exists, 4 * HANG_SECONDS)  # the workers wait on generation
            task.cancel()
            with pytest.raises(asyncio.CancelledError):  # not the 30 s of a generation: it was stopped
                await asyncio.wait_for(task, HANG_SECONDS)
            assert worker_children() == before

    asyncio.run(cancelled())


def test_a_pool_refuses_in_one_line_what_it_was_not_opened_for(tiny_model_dir):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 4)
    other_envs = {"count": FactoryEnvironment(envs["count"].factory)}
    with EngineWorkers(2, envs, backend, renderer) as pool:
        for args, config, words in [
            ((samples, other_envs, backend, renderer), workers_config(), "another task_to_env"),
            (
                (samples, dict(envs), counting_setup(tiny_model_dir, 1)[2], renderer),
                workers_config(),
                "another backend",
            ),
            ((samples, envs, backend, renderer), workers_config(engine_workers=3), "engine_workers=3"),
        ]:
            with pytest.raises(ConfigError) as caught:
                rollout(*args, config, workers=pool)
            assert "\n" not in str(caught.value) and words in str(caught.value), caught.value
        result = rollout(samples, dict(envs), backend, renderer, workers_config(engine_workers=2), workers=pool)
        assert result.metrics["errors"] == {}  # a refusal leaves the pool open
        with pytest.raises(ConfigError, match="opened already"):
            pool.__enter__()


def test_a_pool_serves_one_rollout_at_a_time(tiny_model_dir):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 4)

    async def two_at_once():
        async with EngineWorkers(2, envs, backend, renderer) as pool:
            return await asyncio.gather(
                *(arollout(samples, envs, backend, renderer, workers_config(), workers=pool) for _ in range(2)),
                return_exceptions=True,
            )

    first, second = asyncio.run(two_at_once())
    assert first.metrics["errors"] == {} and len(first.trajectories) == 4  # the refusal left it running
    assert isinstance(second, ConfigError) and "one rollout at a time" in str(second) and "\n" not in str(second)


@pytest.mark.parametrize("count", [0, 1.5, True])
def test_a_bad_worker_count_is_one_line(tiny_model_dir, count):
    _, envs, backend, renderer = counting_setup(tiny_model_dir, 1)
    with pytest.raises(ConfigError) as caught:
        EngineWorkers(count, envs, backend, renderer)
    assert "\n" not in str(caught.value) and f"count={count!r}" in str(caught.value)


def test_a_training_run_starts_its_engine_workers_once(tiny_model_dir, tmp_path, monkeypatch):
    """Synchronous GRPO with ``rollout.engine_workers=2``: one pool for every step's rollout and
    every held-out evaluation (before, during, after)."""
    import json

    from rollforge.recipes.launch import train
    from rollforge.testing import first_character_rows
    from rollforge.train.config import load_config

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in first_character_rows(16)))
    spawned: list[int] = []

    def spawn(number):
        worker = spawn_one(number)
        spawned.append(worker.process.pid)
        return worker

    spawn_one = worker_pool._spawn
    monkeypatch.setattr(worker_pool, "_spawn", spawn)
    before = worker_children()
    config = load_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'run'}",
            "steps=2",
            f"data.path={data}",
            "environments=[{name: 'rollforge.testing:FirstCharacter', task_name: first}]",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=2",
            "rollout.max_turns=1",
            "rollout.engine_workers=2",
            "checkpoint_every=0",
            "eval_episodes=4",
            "eval_every=1",
        ]
    )
    result = train(config, console=False)
    assert len(spawned) == 2  # for two steps and three evaluations, two workers each
    assert set(result.evaluations) == {"before", "step-1", "after"}  # the last step's is "after"
    assert [m["step"] for m in result.history] == [1, 2]
    assert all(m["rollout/episodes"] == 4 for m in result.history)
    assert worker_children() == before
