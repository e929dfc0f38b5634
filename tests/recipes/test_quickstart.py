"""``recipes/quickstart.py``: the warm-up, then GRPO from its weights, on the tiny model."""

import json

import yaml

from rollforge.cli.main import main
from rollforge.recipes.quickstart import PRESETS, quickstart
from rollforge.recipes.sft_config import load_sft_config
from rollforge.train.config import load_config


def test_quickstart_runs_warmup_then_grpo_from_its_weights(tiny_model_dir, tmp_path):
    out = tmp_path / "qs"
    config = load_config(
        PRESETS / "quickstart.yaml",
        [
            f"out={out}",
            f"model.name={tiny_model_dir}",
            "steps=2",
            "eval_episodes=6",
            "rollout.max_new_tokens=8",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
        ],
    )
    warmup = load_sft_config(PRESETS / "quickstart_warmup.yaml", ["max_steps=3", "batch_size=2"])
    result = quickstart(config, warmup)

    sft_lines = [json.loads(l) for l in (out / "warmup" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in sft_lines] == [1, 2, 3] and all(m["examples"] == 2 for m in sft_lines)
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    grpo_config = yaml.safe_load((out / "config.yaml").read_text())
    assert grpo_config["model"]["name"] == str(out / "warmup" / "checkpoints" / "step-000003" / "model")
    evaluations = json.loads((out / "eval.json").read_text())
    assert list(evaluations) == ["before_warmup", "before", "after"] and evaluations == result.evaluations
    assert all(e["episodes"] == 6 and set(e["per_task"]) == {"calculator"} for e in evaluations.values())
    assert set(result.seconds) == {"evaluation", "warmup", "grpo", "total"}

    report = result.report.read_text()
    assert "## 1. Warm-up" in report and "- Steps: 3 (batches of 2 demonstrations)" in report
    assert "## 2. GRPO from the warmed-up weights" in report and "- Steps: 2" in report
    assert "| environment | before warm-up | after warm-up | after GRPO |" in report
    calc = [evaluations[key]["per_task"]["calculator"] for key in ("before_warmup", "before", "after")]
    assert f"| calculator | {calc[0]:.3f} | {calc[1]:.3f} | {calc[2]:.3f} |" in report
    assert "![held-out greedy reward, both phases](held_out_curve.png)" in report  # base, warm-up's end, GRPO's
    assert (out / "held_out_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Total wall time:" in report

    again = quickstart(config, warmup, resume=True)  # warm-up and base evaluation are reused, not redone
    assert set(again.seconds) == {"grpo", "total"}
    assert len((out / "warmup" / "metrics.jsonl").read_text().splitlines()) == 3


def test_quickstart_cli_sends_warmup_keys_to_the_warmup(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "qs"
    code = main(
        [
            "quickstart",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--steps",
            "1",
            "--set",
            "eval_episodes=3",
            "--set",
            "rollout.max_new_tokens=4",
            "--set",
            "warmup.max_steps=2",
            "--set",
            "warmup.optim.lr=0.001",
        ]
    )
    assert code == 0
    warm = yaml.safe_load((out / "warmup" / "config.yaml").read_text())
    assert warm["max_steps"] == 2 and warm["optim"]["lr"] == 0.001 and warm["model"]["name"] == str(tiny_model_dir)
    assert len((out / "warmup" / "metrics.jsonl").read_text().splitlines()) == 2
    assert "# Quickstart report" in capsys.readouterr().out
    assert main(["quickstart", "--out", str(out / "x"), "--set", "warmup.batchsize=2"]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_quickstart_preset_chain_runs_the_chain_presets(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "chain"
    flags = ["--model", str(tiny_model_dir), "--steps", "1", "--set", "eval_episodes=2", "--set", "warmup.max_steps=1"]
    assert main(["quickstart", "--preset", "chain", "--out", str(out), *flags]) == 0
    grpo = yaml.safe_load((out / "config.yaml").read_text())
    warm = yaml.safe_load((out / "warmup" / "config.yaml").read_text())
    for options in (grpo["environments"][0]["options"], warm["sources"][0]["options"]):
        assert options["computations"] == 2 and options["operations"] == ["plus", "times"]
    assert grpo["rollout"]["max_turns"] == warm["rollout"]["max_turns"] == 3 and grpo["steps"] == 1
    # single operations beside the chains, in both phases, and a warm-up that mixes them
    assert [e["task_name"] for e in grpo["environments"]] == ["chain", "single"]
    assert (
        "computations" not in grpo["environments"][1]["options"] and "computations" not in warm["sources"][1]["options"]
    )
    assert warm["shuffle"] is True and grpo["algorithm"]["dynamic_sampling"] is False
    assert "# Quickstart report" in capsys.readouterr().out
