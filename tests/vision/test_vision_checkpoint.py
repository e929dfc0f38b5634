"""A vision-language run's tokenizer and processor: loaded once, shared by the renderer and the
backend, and saved with every checkpoint, so that ``model.name: <checkpoint>/model`` loads back as
the same vision-language model with the same image expansion."""

from __future__ import annotations

import asyncio

import pytest
import torch
import transformers

from rollforge.backends.config import BackendConfig
from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.backends.opening import open_backend
from rollforge.images import ImageProcessing
from rollforge.testing.vlm import make_tiny_vlm, save_tiny_vlm
from rollforge.train import checkpoint as ckpt
from rollforge.train.config import load_config
from rollforge.train.update import TrainedPolicy

from vision_helpers import picture


def _loadable(family: str) -> None:
    if family == "qwen2_vl":  # AutoProcessor builds Qwen2VLProcessor only with torchvision (its video processor)
        pytest.importorskip("torchvision")


def _reopened(path) -> HFVisionBackend:
    """The backend ``model.backend: hf`` opens on ``path``, as ``rollforge train`` / ``eval`` do."""
    backend = open_backend(BackendConfig(kind="hf", model=str(path)))
    assert isinstance(backend, HFVisionBackend)  # the checkpoint is a vision-language model again
    return backend


def _expansions(processor) -> list[tuple[int, ...]]:
    images = ImageProcessing(processor)
    return [images.expansion(picture(k, size)) for k, size in enumerate([(56, 40), (112, 28), (28, 112)])]


@pytest.mark.parametrize("family", ["idefics3", "qwen2_vl"])
def test_a_checkpoint_of_a_vlm_saves_its_processor(family, tmp_path):
    _loadable(family)
    model, processor = make_tiny_vlm(family, seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    policy = TrainedPolicy(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0))
    saved = ckpt.save_checkpoint(tmp_path / "checkpoints", 1, policy, processor, {}, keep=1)
    assert (saved / "model" / "processor_config.json").is_file()
    backend = _reopened(saved / "model")
    try:
        assert backend.processor.image_processor.to_dict() == processor.image_processor.to_dict()
        assert backend.images.placeholder_id == ImageProcessing(processor).placeholder_id
        expansions = _expansions(processor)
        assert len({len(e) for e in expansions}) > 1  # the three pictures take different numbers of tokens
        assert _expansions(backend.processor) == expansions
        assert backend.tokenizer is backend.processor.tokenizer
        assert backend.tokenizer.get_vocab() == processor.tokenizer.get_vocab()
        reloaded = backend.model.state_dict()
        assert all(torch.equal(value, reloaded[name]) for name, value in model.state_dict().items())
    finally:
        asyncio.run(backend.close())


def _config(model_dir, out):
    return load_config(
        overrides=[
            f"model.name={model_dir}",
            f"out={out}",
            "steps=1",
            "environments=[{name: shapes}]",
            "data.size=4",
            "algorithm.batch_size=1",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=4",
            "rollout.max_turns=2",
            "checkpoint_every=0",
        ]
    )


@pytest.fixture
def tokenizer_loads(monkeypatch):
    """Every call of ``AutoTokenizer.from_pretrained`` from now on (the real loader, counted), by
    itself or inside ``AutoProcessor.from_pretrained``."""
    calls = []
    real = transformers.AutoTokenizer.from_pretrained

    def counted(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("pretrained_model_name_or_path"))
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted)
    return calls


def test_a_vlm_run_loads_its_tokenizer_once_and_shares_it(tmp_path, tokenizer_loads):
    from rollforge.train.run_setup import open_run

    model_dir = save_tiny_vlm(tmp_path / "vlm", "idefics3", seed=4)
    tokenizer_loads.clear()

    async def opened():
        async with open_run(_config(model_dir, tmp_path / "run"), console=False) as run:
            return run.tokenizer, run.renderer, run.backend

    tokenizer, renderer, backend = asyncio.run(opened())
    assert len(tokenizer_loads) == 1  # inside the processor; not again for the run, nor for the backend
    assert isinstance(backend, HFVisionBackend)
    assert renderer.tokenizer is tokenizer and backend.tokenizer is tokenizer
    assert renderer.processor is backend.processor and backend.processor.tokenizer is tokenizer


def test_a_trained_vlm_checkpoint_loads_back_with_the_same_processor(tmp_path):
    from rollforge.recipes.launch import train

    model_dir = save_tiny_vlm(tmp_path / "vlm", "idefics3", seed=4)
    result = train(_config(model_dir, tmp_path / "run"), console=False)
    checkpoint = result.out / "checkpoints" / "step-000001"
    assert (checkpoint / "model" / "processor_config.json").is_file()
    backend = _reopened(checkpoint)  # a checkpoint directory stands for its model/
    try:
        assert _expansions(backend.processor) == _expansions(make_tiny_vlm("idefics3", seed=4)[1])
    finally:
        asyncio.run(backend.close())
