"""The process around rollforge: a script that exits without closing what it opened exits 0, and
the synchronous façades run inside a running event loop (a notebook cell)."""

from __future__ import annotations

import _thread
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import rollforge
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.factory import FactoryEnvironment
from rollforge.testing import HANG_SECONDS
from rollforge.types import Sample
from rollforge.workers import run_sync

SRC = str(Path(rollforge.__file__).resolve().parent.parent)


def _run_script(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code`` with SIGINT at its default disposition, as in a terminal."""
    env = dict(os.environ, PYTHONPATH=SRC, TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_a_script_that_never_closes_a_busy_hf_backend_exits_0(tiny_model_dir):
    # Without the exit hook the worker is inside torch when the interpreter finalizes and Python
    # ends it with pthread_exit: "terminate called without an active exception", SIGABRT.
    done = _run_script(
        """
        import asyncio, sys, threading
        import rollforge
        from rollforge.backends.base import SamplingParams
        from rollforge.backends.hf import HFBackend
        from rollforge.backends.settings import HFSettings

        model, tokenizer = rollforge.load_model(sys.argv[1])
        backend = HFBackend(model, tokenizer, HFSettings(prefix_cache_mb=0))
        busy = threading.Event()

        async def generate_forever():
            while True:
                await backend.generate([5] * 8, SamplingParams(max_new_tokens=200))
                busy.set()  # one generation done: the next one starts at once, and runs at exit

        def in_background():
            try:
                asyncio.run(generate_forever())
            except rollforge.BackendError:  # the backend stopped at exit
                pass

        threading.Thread(target=in_background, daemon=True).start()
        busy.wait()
        print("leaving", flush=True)
    """,
        str(tiny_model_dir),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "leaving\n" and "terminate called" not in done.stderr


def test_a_call_abandoned_on_a_worker_finishes_before_the_process_exits():
    # The Ctrl-C'd training step: its caller gave up while the update still runs torch code. The
    # update runs until the exit hook says it waits for it (its warning, seen by a logging handler).
    done = _run_script("""
        import asyncio, logging, threading, torch
        from rollforge.workers import UPDATE_WORKERS

        exit_waits = threading.Event()

        class Witness(logging.Handler):
            def emit(self, record):
                if "to finish before exit" in record.getMessage():
                    exit_waits.set()

        logging.basicConfig()  # the warning still reaches stderr
        logging.getLogger("rollforge.workers").addHandler(Witness())

        def update():
            weights = torch.randn(256, 256)
            while not exit_waits.is_set():
                weights = torch.tanh(weights @ weights)

        async def main():
            try:
                await asyncio.wait_for(UPDATE_WORKERS.run(update), 0.3)
            except asyncio.TimeoutError:
                print("gave up", flush=True)

        asyncio.run(main())
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "gave up\n"
    assert "rollforge-update: waiting up to 300s for 1 running call(s) to finish before exit" in done.stderr


class _Echo:
    def reset(self, **row) -> str:
        return "Say ok."


def _scripted(tiny_model_dir: Path):
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    return ScriptedBackend(lambda request: "ok", renderer, end_token_id=renderer.stop_token_ids[0]), renderer


async def test_rollout_works_inside_a_running_event_loop(tiny_model_dir):
    backend, renderer = _scripted(tiny_model_dir)
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(3)]
    asyncio.get_running_loop()  # as in a notebook cell
    result = rollforge.rollout(samples, {"default": FactoryEnvironment(_Echo)}, backend, renderer)
    assert [t.index for t in result.trajectories] == [0, 1, 2]
    assert [t.messages[-1].content for t in result.trajectories] == ["ok"] * 3


async def test_run_sync_inside_a_loop_raises_what_the_coroutine_raises():
    async def fails():
        await asyncio.sleep(0)
        raise rollforge.ConfigError("bad value")

    with pytest.raises(rollforge.ConfigError, match="bad value"):
        run_sync(fails())


async def test_ctrl_c_while_run_sync_waits_cancels_the_coroutine():
    started, cancelled = threading.Event(), threading.Event()

    async def long_job():
        started.set()
        try:
            await asyncio.sleep(HANG_SECONDS)  # only the cancellation ends it in time
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def ctrl_c_once_started():  # Ctrl-C in the waiting (main) thread, once the job runs
        if started.wait(HANG_SECONDS):
            _thread.interrupt_main()

    # While a notebook cell runs, SIGINT raises KeyboardInterrupt (Python's default handler).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c_once_started, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_sync(long_job())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert cancelled.is_set()
