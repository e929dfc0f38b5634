"""``bench gpu``'s generation section: every candidate on the same requests at the tiny size on a CPU,
the memory floor worked by hand, a failing candidate as one line, and a CPU machine's quick form."""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager

import pytest
import torch

from rollforge.bench import train_throughput
from rollforge.bench.gpu import generation, sections
from rollforge.bench.gpu.settings import QUICK
from rollforge.cli.main import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("tiny")
    sections.build_model_dir("tiny", model_dir, torch.device("cpu"), seed=0)
    return model_dir


def test_every_candidate_generates_the_same_requests_on_a_cpu(tiny):
    settings = dataclasses.replace(QUICK, batch_size=2, generations=3, max_new_tokens=12, gen_prompt_tokens=10)
    result = generation.run(tiny, torch.device("cpu"), settings)
    assert (result["rows"], result["prompt_tokens"], result["max_new_tokens"]) == (6, 10, 12)
    candidates = result["candidates"]
    assert list(candidates) == list(generation.CANDIDATES)
    assert candidates["cb_graphs"] == {"status": "skipped", "reason": "no CUDA device"}
    for name in ("engine", "static", "cb"):
        entry = candidates[name]
        assert entry["status"] == "ok", entry
        assert 6 <= entry["generated_tokens"] <= 6 * 12  # a row may sample its end-of-turn token early
        assert entry["tokens_per_s"] > 0 and entry["ms_per_decode_step"] > 0
        assert entry["floor_fraction"] is None  # no bandwidth for a CPU
    assert result["fastest"] in ("engine", "static", "cb") and result["default"] == "engine"
    assert result["floor"]["seconds"] is None and result["floor"]["weight_bytes"] == 115072 * 4


def test_the_requests_are_seeded_ordinary_ids(tiny):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    settings = dataclasses.replace(QUICK, batch_size=2, generations=2, gen_prompt_tokens=16)
    first, again = generation.make_requests(tokenizer, settings), generation.make_requests(tokenizer, settings)
    assert first == again and len(first.prompts) == 4 and {len(p) for p in first.prompts} == {16}
    assert not set().union(*first.prompts) & set(tokenizer.all_special_ids)
    other = generation.make_requests(tokenizer, dataclasses.replace(settings, seed=1))
    assert other.prompts != first.prompts


def test_the_floor_by_hand_on_an_h200(tiny, monkeypatch):
    # The tiny model: 2 layers, 2 KV heads of 16 dims, float32 -> 2 x 2 x 2 x 16 x 4 = 512 bytes of
    # K and V per token; 4 rows at a mean context of 8 + 8 / 2 = 12 tokens: 24,576 bytes; weights
    # 115,072 x 4 bytes. An H200 reads 4.8e12 bytes/s.
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    model = AutoModelForCausalLM.from_pretrained(tiny)
    requests = generation.Requests(((1,) * 8,) * 4, 8, 0, 2, 0)
    floor = generation.floor_seconds(model, requests, torch.device("cuda"))
    assert (floor["kv_bytes_per_token"], floor["kv_bytes_at_mean_context"]) == (512, 24576)
    assert floor["bytes_per_step"] == 115072 * 4 + 24576
    assert floor["seconds"] == pytest.approx((460288 + 24576) / 4.8e12)
    assert floor["bandwidth_source"] == "NVIDIA H200 (table: H200 memory bandwidth)"


@pytest.mark.parametrize(
    "name, bandwidth",
    [("NVIDIA H100 80GB HBM3", 3.35e12), ("NVIDIA H100 PCIe", 2.0e12), ("NVIDIA A100-SXM4-80GB", 2.0e12)],
)
def test_the_bandwidth_table_matches_the_most_specific_name(name, bandwidth, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert train_throughput.memory_bandwidth(torch.device("cuda"))[0] == bandwidth
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    assert train_throughput.memory_bandwidth(torch.device("cuda")) == (None, None)
    assert train_throughput.memory_bandwidth(torch.device("cpu")) == (None, None)


def test_floor_fraction_is_the_floor_over_the_measured_step(monkeypatch):
    # Rows of 10, 20 and 40 tokens in 2 s: 70 tokens, 35 tok/s, 50 ms a decode step (the longest
    # row's 40 steps); a floor of 5 ms is a tenth of that.
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(generation.time, "perf_counter", lambda: next(clock))
    calls = []

    @contextmanager
    def fake(model, tokenizer, requests):
        yield lambda new_tokens: calls.append(new_tokens) or [10, 20, 40]

    requests = generation.Requests(((1, 2),), 40, 0, 2, 0)
    entry = generation.measure(fake, None, None, requests, 0.005)
    assert calls == [generation.WARMUP_TOKENS, 40]  # an untimed short run first
    assert entry == {
        "status": "ok",
        "generated_tokens": 70,
        "seconds": 2.0,
        "tokens_per_s": 35.0,
        "ms_per_decode_step": 50.0,
        "floor_fraction": 0.1,
    }


def test_a_failing_candidate_is_one_line_and_the_others_run(tiny, monkeypatch):
    @contextmanager
    def broken(model, tokenizer, requests):
        raise RuntimeError("CUDA error: out of memory\nwhile capturing")
        yield

    monkeypatch.setitem(generation.RUNNERS, "static", broken)
    result = generation.run(tiny, torch.device("cpu"), QUICK)
    assert result["candidates"]["static"] == {
        "status": "failed",
        "reason": "RuntimeError: CUDA error: out of memory while capturing",
    }
    assert result["candidates"]["engine"]["status"] == result["candidates"]["cb"]["status"] == "ok"
    assert result["fastest"] in ("engine", "cb")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the quick form stands in only where there is no CUDA")
def test_without_cuda_the_quick_form_runs_and_says_so(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["bench", "gpu", "--sections", "generation", "--out", str(out), "--scratch", str(tmp_path)])
    assert code == 0
    err = capsys.readouterr().err.splitlines()  # then transformers' loading bars
    assert err[0] == "rollforge bench gpu: no CUDA device here, so the quick form runs (--full: the full sizes)"
    report = json.loads(out.read_text())
    assert list(report["models"]) == ["tiny"] and report["settings"]["max_new_tokens"] == QUICK.max_new_tokens
    assert report["models"]["tiny"]["generation"]["status"] == "ok"


def test_quick_and_full_together_are_one_line(tmp_path, capsys):
    assert main(["bench", "gpu", "--quick", "--full", "--out", str(tmp_path / "r.json")]) == 2
    assert capsys.readouterr().err.strip() == "rollforge: error: --quick and --full contradict each other; give one"


@pytest.mark.slow
def test_the_prepared_device_check_writes_one_report(tmp_path):
    # scripts/gpu_check.sh at the quick size on a CPU, its sections narrowed to generation (flags
    # given last win in both runs; the sections themselves are tested above): two runs, one report.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(root / "src")}
    flags = ["--quick", "--device", "cpu", "--models", "tiny", "--sections", "generation", "--scratch", str(tmp_path)]
    done = subprocess.run(
        ["bash", str(root / "scripts" / "gpu_check.sh"), str(out), *flags],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["runs"] == {"first": f"{out}.first.json", "second": f"{out}.second.json"}
    assert report["models"]["tiny"]["generation"]["status"] == "ok"
    second = json.loads((tmp_path / "report.json.second.json").read_text())
    assert second["budget_s"] <= 480 and second["models"]["tiny"]["generation"]["status"] == "ok"
    assert done.stdout.strip().splitlines()[-1].startswith(f"gpu_check.sh: {out} (1 models, ")
