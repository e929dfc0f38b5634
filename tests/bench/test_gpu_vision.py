"""``rollforge bench gpu``'s vision section: on the CPU at the ``--quick`` size (the tests' tiny
Idefics3), a failing run of it reported in one line, and the shipped size is SmolVLM-256M's.
The full size has never run on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from rollforge.bench import gpu
from rollforge.bench.gpu import vision
from rollforge.cli.main import main

pytest.importorskip("PIL.Image")


def _bench(tmp_path, capsys) -> tuple[dict, dict]:
    out = tmp_path / "report.json"
    flags = ["--quick", "--device", "cpu", "--sections", "vision", "--out", str(out), "--scratch", str(tmp_path)]
    assert main(["bench", "gpu", *flags]) == 0
    return json.loads(capsys.readouterr().out), json.loads(out.read_text())


def test_quick_vision_section_generates_with_pictures_and_updates_on_them(tmp_path, capsys):
    printed, report = _bench(tmp_path, capsys)
    assert report["models"] == {}  # no text model is built for the vision section alone
    result = report["vision"]
    assert result["status"] == "ok", result
    assert (result["model"], result["architecture"]) == ("tiny", "Idefics3ForConditionalGeneration")
    generation = result["generation"]
    # 2 episodes x 2 turns, a picture in the prompt and one after the first reply: 4 pictures. A
    # 64-pixel picture is resized to 112 (the long edge), 2 x 2 tiles of 56 plus the global view,
    # 4 tokens each (56 / 14 = 4 patches a side, 16 patches shuffled 2 x 2): 20 image tokens.
    assert (generation["episodes"], generation["turns"], generation["pictures"]) == (2, 4, 4)
    assert generation["tokens_per_picture"] == 20
    assert generation["generated_tokens"] == 16  # 4 tokens a reply: the random model never ended one
    assert generation["generation_tokens_per_s"] > 0 and generation["peak_memory_gib"] is None  # no CUDA
    update = result["update"]
    assert (update["rows"], update["policy_tokens"]) == (2, 16)
    assert update["mean_ratio"] == pytest.approx(1.0, abs=1e-5)  # its first logprobs are the backend's
    assert update["mismatch_max_abs_log_ratio"] < 1e-4
    assert update["seconds"] > 0 and update["peak_memory_gib"] is None
    assert printed["vision"].startswith("ok tiny generation_tokens_per_s=")
    assert printed["models"] == {}


def test_a_failing_vision_section_is_one_line(tmp_path, capsys, monkeypatch):
    def broken(*_args):
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    monkeypatch.setattr(vision, "run", broken)
    printed, report = _bench(tmp_path, capsys)
    assert report["vision"]["status"] == "failed"
    assert report["vision"]["reason"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert printed["vision"] == "failed: RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_the_vision_section_is_skipped_past_the_time_budget(tmp_path):
    report = gpu.run(["tiny"], ("vision",), gpu.QUICK, "cpu", tmp_path / "r.json", str(tmp_path), budget_s=1e-9)
    assert report["vision"]["status"] == "skipped"
    assert "time budget of 0 s was spent" in report["vision"]["reason"]


def test_the_shipped_size_is_smolvlm_256m(tmp_path):
    from PIL import Image

    from rollforge.chat.vision import VisionRenderer

    size = vision.SIZES[gpu.FULL.vision_model]
    model, processor = vision.build_vlm(size, torch.device("meta"), tmp_path, seed=0)
    # SmolVLM-256M-Instruct's parameters (the published checkpoint's count; the head is not tied)
    assert sum(p.numel() for p in model.parameters()) == 256_484_928
    assert len(processor.tokenizer) == model.config.text_config.vocab_size == 49280  # every id decodes
    # 512 / 16 = 32 patches a side, 1,024 shuffled 4 x 4: 64 tokens a tile; any picture is resized to
    # 2,048 pixels on the long edge, 4 x 4 tiles of 512 and the global view: 17 x 64 = 1,088
    assert size.image_seq_len == 64
    assert VisionRenderer(processor).images.tokens(Image.new("RGB", (512, 512))) == 1088
