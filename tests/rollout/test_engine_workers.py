"""Engine worker processes (``RolloutConfig.engine_workers``): the same trajectories as one process,
in input order; a dead worker fails only its own episodes; no worker outlives its rollout."""

from __future__ import annotations

import asyncio
import json
import operator
import os
import pickle
import re
import subprocess
import sys
import threading

import pytest

from rollforge.backends.base import BackendWrapper
from rollforge.backends.router import RouterBackend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout, rollout
from rollforge.testing import HANG_SECONDS, until, wait_until
from rollforge.types import Sample


class Counter:
    """Counts up with a tool; episode ``crash`` kills its whole process at its first tool call."""

    def reset(self, start: int = 0, crash: bool = False, **row) -> str:
        self.total, self.crash = start, crash
        return f"Start at {start}."

    def add(self, amount: int) -> str:
        """Add to the total.

        Args:
            amount: How much to add.
        """
        if self.crash:
            os._exit(3)
        self.total += amount
        self.reward = 1.0 if self.total > 10 else 0.0
        return f"total {self.total}"


class LockedCounter(Counter):
    """A Counter whose episodes from an even start hold a lock: their environment does not pickle."""

    def reset(self, start: int = 0, crash: bool = False, **row) -> str:
        self.lock = threading.Lock() if start % 2 == 0 else None
        return super().reset(start, crash, **row)


class CountingScript:
    """A tool call on the first two turns, then an answer; the amount depends only on the seed (the
    episode index and turn), never on the order requests arrive in. It pickles: workers reopen it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, request) -> str:
        if self.tokenizer.decode(request.prompt_ids).count("total ") >= 2:
            return f"Done after seed {request.params.seed % 1000}."
        amount = request.params.seed % 9
        return f'<tool_call>\n{{"name": "add", "arguments": {{"amount": {amount}}}}}\n</tool_call>'


class Marks:
    """Answers at once, after touching ``path``: a file that exists once generation has begun,
    wherever the backend runs (it pickles: workers reopen it)."""

    def __init__(self, path):
        self.path = str(path)

    def __call__(self, request) -> str:
        open(self.path, "a").close()
        return "Hello."


def counting_setup(tiny_model_dir, episodes: int, crash_at: int | None = None, script=None, latency: float = 0.0):
    from transformers import AutoTokenizer  # here: worker processes import this module for Counter

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = ChatRenderer(tokenizer)
    backend = ScriptedBackend(
        script or CountingScript(tokenizer), tokenizer, end_token_id=renderer.stop_token_ids[0], latency=latency
    )
    samples = [
        Sample(
            prompt=[{"role": "user", "content": f"Count from {i}."}],
            task_name="count",
            row={"start": i, "crash": i == crash_at},
        )
        for i in range(episodes)
    ]
    return samples, {"count": FactoryEnvironment(Counter)}, backend, renderer


def workers_config(**kwargs) -> RolloutConfig:
    return RolloutConfig(
        **{"max_turns": 4, "max_new_tokens": 48, "max_seq_len": 1024, "concurrency": 4, "seed": 7, **kwargs}
    )


def worker_children(me: int | None = None) -> set[int]:
    """Engine worker processes whose parent is ``me`` (default: this process), zombies included (an
    unreaped worker counts)."""
    me, found = me or os.getpid(), set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    spawned = b"worker_main" in cmdline.read()
            except OSError:
                continue
            if parent == me and (spawned or not os.path.exists(f"/proc/{entry}/exe")):
                found.add(int(entry))
    return found


def comparable_fields(trajectory):
    return (
        trajectory.index,
        trajectory.messages,
        trajectory.token_ids,
        trajectory.loss_mask,
        trajectory.logprobs,
        trajectory.rewards,
        trajectory.turns,
        trajectory.error,
        trajectory.failures,
    )


@pytest.mark.parametrize("shared", [False, True], ids=["reopened", "shared"])
def test_two_workers_give_the_same_trajectories_as_one_in_input_order(tiny_model_dir, shared):
    """``reopened``: each worker opens its own copy of the scripted backend (``reopener``);
    ``shared``: behind a wrapper, which has none, the workers' requests come to the one backend."""
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 10)
    if shared:
        backend = BackendWrapper(backend)
    before = worker_children()
    one = rollout(samples, envs, backend, renderer, workers_config())
    seen = []
    two = rollout(
        samples,
        envs,
        backend,
        renderer,
        workers_config(engine_workers=2, first_index=0),
        on_episode=lambda t: seen.append(t.index),
    )
    assert [t.index for t in two.trajectories] == list(range(10))
    assert sorted(seen) == list(range(10))
    assert [comparable_fields(t) for t in two.trajectories] == [comparable_fields(t) for t in one.trajectories]
    assert {t.turns for t in one.trajectories} == {3} and one.metrics["errors"] == {}
    assert len({t.token_ids for t in one.trajectories}) == 10  # every episode its own
    for key in ("episodes", "total_turns", "mean_total_reward", "errors", "failures", "per_task"):
        assert two.metrics[key] == one.metrics[key]
    assert worker_children() == before


def test_environments_come_back_with_their_trajectories_unless_they_do_not_pickle(tiny_model_dir):
    """Episodes that end together travel in one pickle; one whose environment does not pickle (a
    lock) comes back without it, and costs the others of its batch neither theirs nor their data."""
    samples, _, backend, renderer = counting_setup(tiny_model_dir, 6)
    envs = {"count": FactoryEnvironment(LockedCounter)}
    one = rollout(samples, envs, backend, renderer, workers_config(concurrency=6))
    two = rollout(samples, envs, backend, renderer, workers_config(concurrency=6, engine_workers=2))
    assert [comparable_fields(t) for t in two.trajectories] == [comparable_fields(t) for t in one.trajectories]
    assert [t.environment is None for t in two.trajectories] == [True, False] * 3
    assert [t.environment.total for t in two.trajectories[1::2]] == [
        t.environment.total for t in one.trajectories[1::2]
    ]


def test_trajectories_that_end_in_one_loop_iteration_travel_in_one_message():
    from dataclasses import replace

    from rollforge.rollout.worker_process import Finished
    from rollforge.types import Trajectory

    class Recorder:
        def __init__(self):
            self.sent = []

        def send(self, message):
            self.sent.append(message)

    def trajectory(index, environment):
        return Trajectory(
            index=index,
            task_name="count",
            messages=(),
            token_ids=(1, 2),
            loss_mask=(0, 1),
            logprobs=(None, -0.5),
            prompt_length=1,
            rewards=(1.0,),
            total_reward=1.0,
            turns=1,
            environment=environment,
        )

    async def finish():
        channel = Recorder()
        finished = Finished(channel)
        for index, environment in enumerate([{"total": 3}, threading.Lock(), None]):
            finished.add(trajectory(index, environment))
        finished.add(replace(trajectory(9, None), metadata=threading.Lock()))  # does not pickle at all
        await asyncio.sleep(0)
        finished.add(trajectory(3, None))
        await asyncio.sleep(0)
        return channel.sent

    first, second = asyncio.run(finish())
    assert first[0] == second[0] == "episodes"
    batch = pickle.loads(first[1])
    assert [t.index for t in batch] == [0, 1, 2] and [t.environment for t in batch] == [{"total": 3}, None, None]
    assert batch[1] == trajectory(1, None) and [t.index for t in pickle.loads(second[1])] == [3]


def test_a_worker_starts_without_the_heavy_packages():
    """A worker's own code imports no transformers, torch or numpy (a second each to import on a busy
    machine); only what its shard unpickles (the renderer's tokenizer, the environments) may."""
    code = (
        "import sys; import rollforge.rollout.worker_process; "
        "print(sorted({'transformers', 'torch', 'numpy', 'jinja2'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_a_router_here_keeps_each_workers_episode_on_one_replica(tiny_model_dir):
    """Requests proxied from the workers carry their episode: the router's sticky placement holds."""
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 8)
    served: list[tuple[int, str]] = []

    def replica(number: int) -> ScriptedBackend:
        def script(request):
            episode = re.search(r"Count from \d+", renderer.decode(request.prompt_ids)).group()
            served.append((number, episode))
            return backend._script(request)

        return ScriptedBackend(script, renderer.tokenizer, end_token_id=renderer.stop_token_ids[0], latency=0.01)

    router = RouterBackend([replica(0), replica(1)])
    result = rollout(samples, envs, router, renderer, workers_config(engine_workers=2))
    assert result.metrics["errors"] == {} and result.metrics["total_turns"] == 24
    replicas: dict[str, set[int]] = {}
    for number, prompt in served:
        replicas.setdefault(prompt, set()).add(number)
    assert len(replicas) == 8 and all(len(numbers) == 1 for numbers in replicas.values())
    assert router.episodes == [4, 4]


def test_shards_count_on_from_first_index(tiny_model_dir):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 5)
    one = rollout(samples, envs, backend, renderer, workers_config(first_index=40))
    three = rollout(samples, envs, backend, renderer, workers_config(first_index=40, engine_workers=3))
    assert [t.index for t in three.trajectories] == list(range(40, 45))
    assert [comparable_fields(t) for t in three.trajectories] == [comparable_fields(t) for t in one.trajectories]


def test_a_dead_worker_fails_only_its_own_episodes(tiny_model_dir):
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 8, crash_at=6)
    before = worker_children()
    result = rollout(samples, envs, backend, renderer, workers_config(engine_workers=2))
    first, second = result.trajectories[:4], result.trajectories[4:]
    assert [t.error for t in first] == [None] * 4 and [t.turns for t in first] == [3] * 4
    crashed = second[2]
    assert crashed.index == 6 and crashed.error.kind == "env_error" and crashed.outcome == "infra_failure"
    assert "engine worker 1" in crashed.error.message and "exit code 3" in crashed.error.message
    assert result.metrics["episodes"] == 8
    first_start, dead_start = result.metrics["engine_worker_start_cpu_seconds"]
    assert first_start > 0 and dead_start > 0  # both were ready (the start is reported with "ready")
    assert worker_children() == before


def test_a_bug_raised_in_a_worker_propagates_and_no_worker_is_left(tiny_model_dir):
    # itemgetter raises TypeError with no frame of anyone else's code: a rollforge bug, which a
    # one-process rollout raises too (boundary.is_own_bug)
    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 4, script=operator.itemgetter(5))
    with pytest.raises(TypeError):
        rollout(samples, envs, backend, renderer, workers_config())
    before = worker_children()
    with pytest.raises(TypeError):
        rollout(samples, envs, backend, renderer, workers_config(engine_workers=2))
    assert worker_children() == before


def test_cancelling_the_rollout_stops_every_worker(tiny_model_dir, tmp_path):
    """What Ctrl-C does: ``asyncio.run`` cancels the rollout's task."""
    generating = tmp_path / "generating"
    samples, envs, slow, renderer = counting_setup(tiny_model_dir, 6, script=Marks(generating), latency=30.0)
    before = worker_children()

    async def cancelled() -> None:
        task = asyncio.ensure_future(arollout(samples, envs, slow, renderer, workers_config(engine_workers=2)))
        # both workers are up and generation has begun (starting two interpreters takes a while)
        assert await until(lambda: len(worker_children() - before) == 2 and generating.exists(), 4 * HANG_SECONDS)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):  # not the 30 s of a generation: it was stopped
            await asyncio.wait_for(task, HANG_SECONDS)

    asyncio.run(cancelled())
    assert worker_children() == before


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_stop_when_their_parent_is_killed(tiny_model_dir, tmp_path):
    """A parent killed outright (SIGKILL: nothing of it runs) leaves no worker behind: each sees its
    socket close and exits."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "import test_engine_workers as T\n"
        "if __name__ == '__main__':\n"
        f"    samples, envs, backend, renderer = T.counting_setup({str(tiny_model_dir)!r}, 6, latency=60.0)\n"
        "    T.rollout(samples, envs, backend, renderer, T.workers_config(engine_workers=2))\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: len(worker_children(parent.pid)) >= 2 or parent.poll() is not None, 4 * HANG_SECONDS)
        workers = worker_children(parent.pid)
        assert len(workers) == 2
    finally:
        parent.kill()
        parent.wait()
    assert wait_until(lambda: not any(_running(pid) for pid in workers))


def test_a_closed_channel_has_written_its_last_frame():
    """A worker exits right after ``Channel.close``: by then its last frame (a big batch of
    trajectories, more than a socket buffer holds, to a parent busy elsewhere) has been written
    whole, and nothing follows it."""
    import importlib
    import socket
    import threading

    channel_module = importlib.import_module("rollforge.rollout.worker_channel")
    ours, theirs = socket.socketpair()
    received, closing = bytearray(), threading.Event()

    def read() -> None:
        closing.wait(HANG_SECONDS)  # the parent is busy until the worker finishes
        while chunk := theirs.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()

    async def send_and_close() -> None:
        channel = await channel_module.Channel.open(ours)
        channel.send(("episode", b"x" * 8_000_000))  # far more than a socket buffer holds
        closing.set()
        await channel.close()

    asyncio.run(send_and_close())
    ours.close()  # what the process's exit does
    reader.join(30)
    size = int.from_bytes(received[:8], "big")
    assert size == len(received) - 8 and pickle.loads(received[8:]) == [("episode", b"x" * 8_000_000)]


def test_a_bad_engine_workers_value_is_one_line():
    with pytest.raises(ConfigError) as caught:
        RolloutConfig.build(engine_workers=0)
    assert "\n" not in str(caught.value) and "engine_workers" in str(caught.value) and "(got 0)" in str(caught.value)


def test_environments_that_do_not_pickle_are_refused_in_one_line(tiny_model_dir):
    samples, _, backend, renderer = counting_setup(tiny_model_dir, 2)

    class Local(Counter):  # defined in a function: a worker process cannot import it
        pass

    with pytest.raises(ConfigError) as caught:
        rollout(samples, {"count": FactoryEnvironment(Local)}, backend, renderer, workers_config(engine_workers=2))
    assert "\n" not in str(caught.value) and "engine_workers=2" in str(caught.value)


def test_rollout_command_with_engine_workers_generates_in_this_process(tiny_model_dir, tmp_path, capsys):
    """``--engine-workers 2`` with the HF backend (a model in this process: the workers' requests come
    here) writes every episode, in input order."""
    from rollforge.cli.main import main

    out = tmp_path / "out"
    code = main(
        [
            "rollout",
            "--model",
            str(tiny_model_dir),
            "--env",
            "arithmetic",
            "--episodes",
            "4",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "8",
            "--engine-workers",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2, 3]
    assert all(row["token_ids"] and row["error"] is None for row in rows)


@pytest.mark.parametrize("flags", [["--engine-workers", "0"], ["--engine-workers", "2", "--executor", "ray"]])
def test_bad_engine_workers_flags_are_one_line(tiny_model_dir, tmp_path, capsys, flags):
    from rollforge.cli.main import main

    code = main(["rollout", "--model", str(tiny_model_dir), "--episodes", "2", "--out", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "engine" in err, err


def test_bench_scale_with_two_engine_workers_times_a_warm_pool(tiny_model_dir):
    from rollforge.bench import scale

    result = scale.run(episodes=200, turns=2, latency=0.05, tokenizer_dir=str(tiny_model_dir), engine_workers=2)
    assert result["errors"] == {} and result["tool_failures"] == {}
    assert result["engine_workers"] == 2 and result["turns_completed"] == 400
    assert result["worker_cpu_seconds"] > 0 and result["wall_seconds"] >= result["lower_bound_seconds"]
    starts = result["worker_start_cpu_seconds"]  # the pool's start, before the clock started
    assert len(starts) == 2 and all(0 < cpu < result["worker_cpu_seconds"] for cpu in starts)
    assert sum(starts) < result["worker_cpu_seconds"]  # the workers' CPU counts their start and their rollout
    assert result["worker_start_seconds"] > 0


class _CollectorWitness:
    """Records, as it is unpickled, whether the cyclic collector was running."""

    seen: list = []

    def __init__(self):
        self.state = 1

    def __setstate__(self, state):
        import gc

        type(self).seen.append(gc.isenabled())


def test_what_arrives_is_unpickled_with_the_collector_paused_and_left_as_it_was():
    # 5,000 trajectories held: 55 us to load one with the cyclic collector running, 37 paused.
    import gc

    from rollforge.rollout.worker_channel import dumps, loads

    blob = dumps([_CollectorWitness()])
    _CollectorWitness.seen.clear()
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            loads(blob)
            assert gc.isenabled() is state
        gc.enable()
        with pytest.raises(pickle.UnpicklingError):
            loads(b"not a pickle")
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert _CollectorWitness.seen == [False, False]


def test_a_workers_shard_runs_without_the_checks_its_rollouts_process_ran_for_the_whole_batch(
    tiny_model_dir, monkeypatch
):
    # A worker used to check its shard's prompt lengths again: ~0.1 s of CPU per worker at 5,000 episodes.
    from rollforge.rollout import checks, engine

    samples, envs, backend, renderer = counting_setup(tiny_model_dir, 2)
    calls = []
    monkeypatch.setattr(checks, "check_prompt_lengths", lambda *args: calls.append(len(args[0])))
    result = asyncio.run(engine.run_checked(samples, envs, backend, renderer, workers_config()))
    assert calls == [] and [t.turns for t in result.trajectories] == [3, 3]
    asyncio.run(arollout(samples, envs, backend, renderer, workers_config()))
    assert calls == [2]  # arollout checks, once for its batch
