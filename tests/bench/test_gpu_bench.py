"""``rollforge bench gpu``: end to end on the CPU (CUDA-only sections skipped with a reason), the
boundary that turns a failing section into one line, the shipped architectures, and (``-m gpu``)
the same run on a CUDA device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rollforge.bench import gpu
from rollforge.bench.gpu import sections
from rollforge.bench.gpu.settings import GpuSettings
from rollforge.cli.main import main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _bench(tmp_path: Path, *flags: str) -> tuple[dict, dict]:
    """Run ``rollforge bench gpu --quick`` in a fresh interpreter (it opens a process group and
    seeds torch); its printed summary and its report."""
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the bench's own choice, unless the user made one
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollforge",
            "bench",
            "gpu",
            "--quick",
            "--out",
            str(out),
            "--scratch",
            str(tmp_path / "scratch"),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), json.loads(out.read_text())


@pytest.mark.slow
def test_quick_run_on_cpu_reports_every_section(tmp_path):
    printed, report = _bench(tmp_path, "--device", "cpu")
    entry = report["models"]["tiny"]
    assert list(entry) == ["model", *gpu.SECTIONS]
    assert entry["train_throughput"] == {"status": "skipped", "reason": "no CUDA device"}
    assert entry["model"]["status"] == "ok" and entry["model"]["parameters"] == 115072
    grpo = entry["grpo"]
    assert grpo["status"] == "ok" and grpo["steps_timed"] == 1 and grpo["completions_per_step"] == 4
    assert set(grpo["split_seconds"]) == {"rollout", "update", "sync"}
    assert grpo["seconds_per_step"] > 0 and grpo["generation_tokens_per_s"] > 0 and grpo["update_tokens_per_s"] > 0
    assert grpo["update_mfu"] is None  # no bf16 peak on a CPU
    assert len(grpo["update_micro_batches"]) == 1 and grpo["update_micro_batches"][0] >= 1  # per timed step
    trl = entry["trl"]
    assert trl["status"] == "ok" and trl["ratio_step_time"] == pytest.approx(
        grpo["seconds_per_step"] / trl["seconds_per_step"], rel=1e-2
    )
    fsdp = entry["fsdp2"]
    assert fsdp["status"] == "ok" and (fsdp["backend"], fsdp["world_size"]) == ("gloo", 1)
    assert fsdp["resumed_step"] == 1 and fsdp["resumed_weights_match"] and fsdp["next_loss_matches"]
    assert report["environment"]["device"] == "cpu" and report["environment"]["peak_bf16_flops_per_s"] is None
    assert report["environment"]["cuda_alloc_conf"] == "expandable_segments:True"  # set before CUDA starts
    assert printed["models"]["tiny"]["train_throughput"] == "skipped: no CUDA device"
    assert printed["models"]["tiny"]["fsdp2"] == "ok next_loss_matches=True"
    candidates = entry["generation"]["candidates"]
    assert {name: c["status"] for name, c in candidates.items()} == {
        "engine": "ok",
        "static": "ok",
        "cb": "ok",
        "cb_graphs": "skipped",
    }


@pytest.mark.slow
def test_a_failing_section_is_one_line_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    def broken(*_args):
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")

    monkeypatch.setattr(sections, "grpo", broken)
    out = tmp_path / "report.json"
    code = main(
        [
            "bench",
            "gpu",
            "--quick",
            "--device",
            "cpu",
            "--sections",
            "grpo,train_throughput",
            "--out",
            str(out),
            "--scratch",
            str(tmp_path),
        ]
    )
    assert code == 0
    entry = json.loads(out.read_text())["models"]["tiny"]
    assert entry["grpo"]["status"] == "failed"
    assert entry["grpo"]["reason"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert entry["train_throughput"]["status"] == "skipped"
    printed = json.loads(capsys.readouterr().out)
    assert printed["models"]["tiny"]["grpo"].startswith("failed: RuntimeError: CUDA error")


def test_sections_past_the_time_budget_are_skipped(tmp_path):
    report = gpu.run(["tiny"], ("grpo", "fsdp2"), gpu.QUICK, "cpu", tmp_path / "r.json", str(tmp_path), budget_s=1e-9)
    entry = report["models"]["tiny"]
    assert entry["model"]["status"] == "ok"
    for section in ("grpo", "fsdp2"):
        assert entry[section]["status"] == "skipped" and "time budget of 0 s was spent" in entry[section]["reason"]
    assert json.loads((tmp_path / "r.json").read_text()) == report


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--models", "qwen4-7b"],
            "unknown model 'qwen4-7b' for bench gpu; expected one of llama-3.2-1b, qwen2.5-0.5b, qwen3-0.6b, tiny",
        ),
        (
            ["--sections", "grpo,vllm"],
            "--sections must name some of generation, grpo, trl, fsdp2, train_throughput, vision, got 'grpo,vllm'",
        ),
    ],
)
def test_a_bad_flag_is_one_line(flags, message, tmp_path, capsys):
    assert main(["bench", "gpu", "--out", str(tmp_path / "r.json"), *flags]) == 2
    assert capsys.readouterr().err.strip() == f"rollforge: error: {message}"
    assert not (tmp_path / "r.json").exists()


def test_the_shipped_configs_are_the_published_architectures():
    from transformers import AutoConfig, AutoModelForCausalLM

    # Parameter counts of the published checkpoints (tied embeddings counted once).
    published = {
        "qwen2.5-0.5b": ("Qwen2ForCausalLM", 494_032_768),
        "qwen3-0.6b": ("Qwen3ForCausalLM", 596_049_920),
        "llama-3.2-1b": ("LlamaForCausalLM", 1_235_814_400),
    }
    for name in sections.MODELS:
        spec = sections.model_spec(name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec))
        assert (type(model).__name__, sum(p.numel() for p in model.parameters())) == published[name]


def test_the_configs_ship_as_package_data():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"bench/gpu/models/*.json"' in pyproject


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quick_run_on_cuda_runs_every_section(tmp_path):
    _, report = _bench(tmp_path, "--device", "cuda")
    entry = report["models"]["tiny"]
    assert {s: entry[s]["status"] for s in gpu.SECTIONS} == {s: "ok" for s in gpu.SECTIONS}, entry
    assert entry["fsdp2"]["backend"] == "nccl" and entry["fsdp2"]["resumed_weights_match"]
    assert entry["train_throughput"]["dtype"] == "bfloat16" and entry["train_throughput"]["tokens_per_s"] > 0
    candidates = entry["generation"]["candidates"]
    assert {c["status"] for c in candidates.values()} == {"ok"}, candidates  # CUDA graphs and compile included
    assert all(c["floor_fraction"] is None or c["floor_fraction"] > 0 for c in candidates.values())
    assert report["environment"]["gpus"] >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_real_architecture_builds_and_updates_in_bfloat16_on_cuda(tmp_path):
    where = torch.device("cuda")
    info = sections.build_model_dir("qwen3-0.6b", tmp_path / "m", where, seed=0)
    assert info["parameters"] == 596_049_920 and info["saved_dtype"] == "bfloat16"
    result = sections.train_throughput(tmp_path / "m", where, GpuSettings(pack_tokens=2048, pack_steps=1))
    assert result["dtype"] == "bfloat16" and result["step_s"] > 0 and result["peak_memory_gib"] > 0


def test_the_pack_section_runs_train_throughput_on_the_built_model(tmp_path):
    where = torch.device("cpu")
    info = sections.build_model_dir("tiny", tmp_path / "m", where, seed=0)
    assert (info["parameters"], info["vocab_size"], info["tokenizer_vocab"]) == (115072, 640, 640)
    result = sections.train_throughput(tmp_path / "m", where, GpuSettings(pack_tokens=32, pack_steps=1))
    assert (result["seq_len"], result["steps"], result["dtype"], result["mfu"]) == (32, 1, "float32", None)
    assert result["tokens_per_s"] > 0 and "11% MFU for Qwen3-0.6B" in result["anchor"]


def test_the_tokenizer_covers_every_id_the_model_can_sample(tmp_path, monkeypatch):
    # The backend refuses token ids outside the tokenizer: a model of a real architecture (151,936
    # ids) with the 640-id test tokenizer failed every episode as an infrastructure failure.
    from transformers import AutoTokenizer

    from rollforge.testing import make_tokenizer

    tiny = sections.model_spec("tiny")
    monkeypatch.setattr(sections, "model_spec", lambda name: {**tiny, "vocab_size": 700})
    info = sections.build_model_dir("tiny", tmp_path, torch.device("cpu"), seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert info["tokenizer_vocab"] == len(tokenizer) == 700
    assert tokenizer.decode([640, 641, 665, 666, 699]) == "~a~b~z~ba~ch"  # letters only: the reward reads numbers
    text = "What is 3 + 4? Answer with just the number."
    assert tokenizer.encode(text) == make_tokenizer().encode(text)  # no merge produces the new ids
    with pytest.raises(Exception, match="more than the model's vocab_size 600"):
        sections.pad_vocabulary(tmp_path / "tokenizer.json", 600)
