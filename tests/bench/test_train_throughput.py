"""``rollforge bench train-throughput`` on the tiny model: real updates timed, FLOPs by hand."""

from __future__ import annotations

import json

import pytest
import torch

from rollforge.bench import train_throughput as bench
from rollforge.cli.main import main
from rollforge.errors import ConfigError
from rollforge.models import load_model


def _tiny_flops(tiny_model_dir, seq_len):
    # The tiny Llama: hidden 64, MLP 128, 2 layers, 4 heads of 16 (2 key/value heads), tied head.
    # Per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12288, MLP 3*64*128 = 24576, norms 2*64:
    # 36992; 2 layers and the final norm: 74048; the output head 64 x vocab.
    vocab = load_model(tiny_model_dir)[0].config.vocab_size
    n = 74048 + 64 * vocab
    return n, 6 * n + 12 * 2 * (4 * 16) * seq_len


def test_two_steps_on_the_tiny_model(tiny_model_dir):
    result = bench.run(str(tiny_model_dir), bench.Workload(batch=3, seq_len=16, steps=2, warmup=1), device="cpu")
    assert result["tokens"] == 3 * 16 * 2
    n, flops = _tiny_flops(tiny_model_dir, 16)
    assert (result["matmul_params"], result["flops_per_token"]) == (n, flops)
    assert result["tokens_per_s"] == pytest.approx(result["tokens"] / result["seconds"])
    assert result["step_s"] == pytest.approx(result["seconds"] / 2) and 0 < result["step_s_min"] <= result["step_s"]
    assert result["achieved_flops_per_s"] == pytest.approx(flops * result["tokens_per_s"])
    assert (result["device"], result["dtype"], result["mfu"], result["peak_flops_per_s"]) == (
        "cpu",
        "float32",
        None,
        None,
    )
    given = bench.run(
        str(tiny_model_dir), bench.Workload(batch=1, seq_len=8, steps=2, warmup=0), "cpu", "bfloat16", peak=1e12
    )
    assert given["dtype"] == "bfloat16" and given["peak_source"] == "--peak-flops"
    assert given["mfu"] == pytest.approx(given["achieved_flops_per_s"] / 1e12)


def test_the_peak_comes_from_the_gpu_table_for_bfloat16_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    cuda = torch.device("cuda")
    assert bench.peak_flops(cuda, torch.bfloat16) == (989e12, "NVIDIA H100 80GB HBM3 (table: H100 bf16 dense)")
    assert bench.peak_flops(cuda, torch.float32) == (None, None)
    assert bench.peak_flops(torch.device("cpu"), torch.bfloat16) == (None, None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert bench.peak_flops(cuda, torch.bfloat16)[0] == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert bench.peak_flops(cuda, torch.bfloat16)[0] == 312e12


def test_bad_sizes_are_named(tiny_model_dir):
    with pytest.raises(ConfigError, match="seq_len must be >= 2, got 1"):
        bench.run(str(tiny_model_dir), bench.Workload(seq_len=1), device="cpu")
    with pytest.raises(ConfigError, match="unknown device 'gpu'"):
        bench.run(str(tiny_model_dir), device="gpu")


def test_the_cli_prints_the_json(tiny_model_dir, capsys):
    argv = [
        "bench",
        "train-throughput",
        "--model",
        str(tiny_model_dir),
        "--batch",
        "2",
        "--seq-len",
        "8",
        "--steps",
        "2",
        "--warmup",
        "0",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokens"] == 32 and result["mfu"] is None
