"""``rollforge sft --resume``: a run stopped after a checkpoint continues as if it had not stopped
(the same batches, the restored optimizer); the step lines name rounds, not the sources' phase 0."""

from __future__ import annotations

import json

from rollforge.cli.main import main


def _config(tmp_path, tiny_model_dir, name, *extra):
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"model: {{name: {tiny_model_dir}}}\nout: {tmp_path / name}\nbatch_size: 2\nepochs: 2\ncheckpoint_every: 1\n"
        "optim: {lr: 1.0e-2}\nsources:\n  - {kind: expert, env: echo, episodes: 4}\n" + "".join(extra)
    )
    return path


def _losses(out):
    return [round(json.loads(line)["loss"], 6) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_sft_resume_continues_as_the_uninterrupted_run(tiny_model_dir, tmp_path, capsys):
    whole = _config(tmp_path, tiny_model_dir, "whole")
    assert main(["sft", str(whole)]) == 0  # 4 demonstrations, batches of 2, 2 epochs: 4 steps
    err = capsys.readouterr().err
    assert "sft step    1/4  loss" in err and "phase" not in err
    parts = _config(tmp_path, tiny_model_dir, "parts")
    assert main(["sft", str(parts), "--set", "max_steps=2"]) == 0
    capsys.readouterr()
    assert main(["sft", str(parts), "--resume", "--set", "max_steps=2"]) == 0
    assert capsys.readouterr().out.startswith("nothing to do: the run in ")
    assert main(["sft", str(parts), "--resume", "--set", "batch_size=4"]) == 2
    assert "changed config: batch_size 2 -> 4" in capsys.readouterr().err
    assert main(["sft", str(parts), "--resume"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fine-tuned 2 steps (3-4), 2 optimizer updates; loss "), out
    assert _losses(tmp_path / "parts") == _losses(tmp_path / "whole")
