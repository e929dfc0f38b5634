"""Shared fixtures of the vision tests: the tiny vision-language models of ``rollforge.testing.vlm``,
one per family, built once per session."""

from __future__ import annotations

import pytest

from rollforge.testing.vlm import VLM_FAMILIES, make_tiny_vlm

pytest.importorskip("PIL.Image")


@pytest.fixture(scope="session", params=VLM_FAMILIES)
def vlm(request):
    """(family, model, processor) for each family."""
    model, processor = make_tiny_vlm(request.param)
    return request.param, model, processor
