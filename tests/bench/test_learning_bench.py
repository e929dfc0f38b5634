"""``rollforge bench learning``: the time-to-target arithmetic, and (with the ``bench-trl`` extra) an
end-to-end run on the tiny model that checks the report's shape, not learning."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rollforge.bench.learning import curve, preset, time_to_target_bound, time_to_target_ratio


def test_curve_sums_the_step_times_up_to_each_evaluated_step():
    assert curve([1.0, 2.0, 3.0, 4.0], {0: 0.25, 2: 0.5, 4: 0.75}) == [
        {"step": 0, "seconds": 0.0, "reward": 0.25},
        {"step": 2, "seconds": 3.0, "reward": 0.5},  # 1 + 2
        {"step": 4, "seconds": 10.0, "reward": 0.75},  # 1 + 2 + 3 + 4
    ]


def test_ratio_time_to_target_is_rollforge_seconds_over_trls_to_reach_trls_final_reward():
    trl = [
        {"step": 0, "seconds": 0.0, "reward": 0.2},
        {"step": 2, "seconds": 20.0, "reward": 0.5},
        {"step": 4, "seconds": 40.0, "reward": 0.5},
    ]
    ours = [
        {"step": 0, "seconds": 0.0, "reward": 0.2},
        {"step": 2, "seconds": 8.0, "reward": 0.4},
        {"step": 4, "seconds": 16.0, "reward": 0.6},
    ]
    assert time_to_target_ratio(ours, trl)[0] == 0.8  # TRL first reaches 0.5 at 20 s, rollforge at 16 s
    missed, note = time_to_target_ratio(ours[:2], trl)
    assert missed is None and note == "rollforge did not reach TRL's final held-out reward 0.5 (it ended at 0.4)"
    flat = [{"step": 0, "seconds": 0.0, "reward": 0.2}, {"step": 2, "seconds": 20.0, "reward": 0.2}]
    assert time_to_target_ratio(ours, flat) == (
        None,
        "TRL ends at held-out reward 0.2, no higher than the warm-up's 0.2: no target",
    )
    assert time_to_target_bound(ours, flat) == 0.8  # rollforge reached its 0.6 at 16 s; TRL not in 20 s
    assert time_to_target_bound(ours, trl) == 0.4  # TRL's best, 0.5, is below rollforge's 0.6: 16 s / 40 s
    assert time_to_target_bound(ours, [*trl[:2], {"step": 4, "seconds": 40.0, "reward": 0.6}]) is None  # TRL got there
    assert time_to_target_bound(flat, trl) is None  # rollforge gained nothing: no bound


needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")


@pytest.mark.slow
@needs_trl
def test_learning_bench_runs_each_side_in_its_own_process_end_to_end(tiny_model_dir, tmp_path, capsys):
    from rollforge.bench.learning import SAMPLING
    from rollforge.cli.main import main

    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "learning",
            "--model",
            str(tiny_model_dir),
            "--steps",
            "2",
            "--batch-size",
            "1",
            "--generations",
            "2",
            "--max-new-tokens",
            "8",
            "--eval-every",
            "1",
            "--eval-episodes",
            "2",
            "--trl-micro-batch",
            "1",  # TRL: one generation of 2, two loss forwards
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads((out / "result.json").read_text()) == result
    assert (out / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio_time_to_target" in result and isinstance(result["ratio_note"], str)
    for side in ("trl", "rollforge"):
        points = result["held_out_curves"][side]
        assert [p["step"] for p in points] == [0, 1, 2]
        assert points[0] == {"step": 0, "seconds": 0.0, "reward": points[0]["reward"]}
        assert points[0]["reward"] == result["held_out_curves"]["trl"][0]["reward"]  # one warm-up, both sides
        assert 0 < points[1]["seconds"] < points[2]["seconds"] == result[side]["train_seconds"]
        assert all(0.0 <= p["reward"] <= 1.0 for p in points)
        assert len(result[side]["train_reward_per_step"]) == 2
        assert result[side]["sampling"] == SAMPLING  # what each trainer generated with
        phases = result[side]["phases_per_step"]
        assert set(phases) == {"generation", "update", "other"} and phases["generation"] > 0 <= phases["update"]
        assert result[side]["generated_tokens_per_step"] > 0
    assert result["trl"]["prompt_tokens"] == result["rollforge"]["prompt_tokens"]  # the same tools, in the same order
    assert set(result["max_rss_mb"]) == {"warmup", "rollforge", "trl"}
    assert all(0 < mb < 8192 for mb in result["max_rss_mb"].values())
    settings = result["settings"]
    assert (settings["completions_per_step"], settings["eval_every"], settings["eval_episodes"]) == (2, 1, 2)
    assert (settings["max_turns"], settings["max_tool_calls"], settings["max_completion_tokens"]) == (
        3,
        2,
        24,
    )  # the closing reply is a turn
    assert settings["operations"] == ["plus", "times"] and settings["lr"] == preset()["lr"]
    assert settings["workload"] == "calculator" and settings["warmup"].startswith("built")
    assert (settings["balanced"], settings["shuffle"]) == (True, False)  # the quickstart's prompts, in order


@pytest.mark.slow
@needs_trl
def test_a_sides_failure_is_one_line_naming_the_side(tmp_path, capsys):
    from rollforge.cli.main import main

    (tmp_path / "not-a-model").mkdir()
    code = main(["bench", "learning", "--model", str(tmp_path / "not-a-model"), "--steps", "1"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert lines[-1].startswith("rollforge: error: bench learning: the warmup side failed: ")
    assert str(tmp_path / "not-a-model") in lines[-1]


@pytest.mark.slow
@needs_trl
def test_a_warmup_trained_under_another_template_is_refused_in_one_line(tiny_model_dir, tmp_path, capsys):
    """The quickstart's warm-up renders SmolLM2's template with rollforge's tool prompt; under the
    bench's Qwen2.5 template its calls do not parse (it scored 0.0): refused before any side starts."""
    from rollforge.bench.learning.sides import check_warmup, templated
    from rollforge.cli.main import main

    code = main(["bench", "learning", "--warmup", str(tiny_model_dir), "--steps", "1"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rollforge: error: --warmup {tiny_model_dir} was trained under another chat template than bench learning "
        "renders (TRL's Qwen2.5, which TRL parses tool calls from): use a warm-up that bench learning built "
        "(omit --warmup), not the quickstart's"
    )
    check_warmup(templated(tiny_model_dir, tmp_path / "templated"))  # the bench's own template passes


def test_a_side_killed_by_a_signal_is_named_with_the_signal(tmp_path, monkeypatch):
    from rollforge.bench.learning import sides
    from rollforge.errors import SideFailed

    # what the kernel does to a process out of memory; the child writes no result
    monkeypatch.setattr(
        sides, "CHILD", (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    )
    with pytest.raises(SideFailed) as failed:
        sides.spawn("trl", {}, tmp_path)
    assert str(failed.value) == (
        "bench learning: the trl side was killed by SIGKILL (perhaps out of memory) before writing its result"
    )


def test_a_side_ends_when_its_parent_is_killed(tmp_path):
    """``kill PID`` of bench learning reaches only the parent: the running side must not live on
    (it held 13 GB for TRL's). The side sleeps ten minutes; it must be gone long before (the wait
    for it only catches a side that lives on)."""
    import os
    import signal
    import subprocess

    from rollforge.testing import HANG_SECONDS, wait_until

    if not Path("/proc/self/stat").is_file():
        pytest.skip("reads /proc (Linux)")
    child = (
        "import os, sys, time; from rollforge.bench.learning.sides import PARENT, die_with_parent; "
        "die_with_parent(int(os.environ[PARENT])); open(sys.argv[3] + '.pid', 'w').write(str(os.getpid())); time.sleep(600)"
    )
    parent = (
        "import sys; from pathlib import Path; from rollforge.bench.learning import sides; "
        f"sides.CHILD = (sys.executable, '-c', {child!r}); sides.spawn('trl', {{}}, Path(sys.argv[1]))"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent, str(tmp_path)])
    pid_file = tmp_path / "trl.result.json.pid"
    assert wait_until(lambda: pid_file.is_file() and pid_file.read_text() != "", 2 * HANG_SECONDS)
    side = int(pid_file.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=HANG_SECONDS)

    def gone() -> bool:  # or dead and unreaped
        stat = Path(f"/proc/{side}/stat")
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    if not wait_until(gone):
        os.kill(side, signal.SIGKILL)
        pytest.fail("the side outlived its parent")


def test_trl_plays_the_bundled_class_unchanged_and_calls_after_answer_change_nothing(tmp_path):
    from transformers.utils import get_json_schema

    from rollforge.bench.vs_trl.workloads import calculator
    from rollforge.envs.library.calculator import EPISODE_OVER, build
    from rollforge.envs.tools import class_tools

    workload = calculator(tmp_path, rows=4)
    row = workload.rows[0]
    bundled = build().factory[row["environment"]]()  # what rollforge plays this row with
    env = workload.trl_environment_factory()
    assert (
        type(env) is type(bundled) and type(env).__qualname__ == "CalculatorEnv_add_multiply"
    )  # the class itself, no adapter
    for name in ("add", "multiply", "answer"):  # the same tools, so both trainers render the same prompt
        assert get_json_schema(getattr(env, name)) == class_tools(type(bundled))[name].schema()
    env.reset(**{k: v for k, v in row.items() if k != "prompt"})
    assert env.answer(row["result"] + 1) == "Recorded." and env.done
    # TRL's extra turn (or a second call in the same message): refused, the reward stays the answered one
    assert env.answer(row["result"]) == EPISODE_OVER and env.add(1, 2) == EPISODE_OVER
    assert env.get_reward() == 0.0


def test_when_trl_fails_first_its_error_is_raised_not_the_waiting_sides(monkeypatch, tmp_path):
    from rollforge.bench.vs_trl import runners

    def broken_trl(*_args, **_kwargs):
        raise ValueError("TRL broke")

    monkeypatch.setattr(runners, "run_trl", broken_trl)  # rollforge waits for a turn that never comes
    with pytest.raises(ValueError, match="TRL broke"):
        runners.run_alternating(None, {}, tmp_path)
