"""``rollforge rollout`` and ``rollforge eval`` as a user of other people's code drives them: TRL-style
classes and reward functions (``--reward file.py:function``, applied by training's own code), a
rollout that nothing scores said in one line instead of zeros, a used ``--out`` refused (and
``--overwrite``), ``eval`` on ``--data`` and ``file.py:Class`` (the README's Counter), and missing
task libraries named by their extra."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollforge.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CATCH = '''
class Catch:
    """As TRL's catch example: the score is kept for reward functions (``self.reward``), no get_reward()."""

    def reset(self, **row):
        self.reward = 1.0  # a caught ball, whatever the tiny model says
        return "Catch the ball."

    def move(self, direction: str) -> str:
        """Move the paddle.

        Args:
            direction: left or right.
        """
        return "moved"


def catch_reward(environments, **kwargs):
    return [env.reward for env in environments]
'''


@pytest.fixture
def catch(tmp_path):
    (tmp_path / "catch_env.py").write_text(CATCH)
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "Play."}\n{"prompt": "Play again."}\n')
    return tmp_path / "catch_env.py", data


def rollout(tiny_model_dir, env, data, out, *flags):
    argv = ["rollout", "--model", str(tiny_model_dir), "--env", f"{env}:Catch", "--data", str(data)]
    return main([*argv, "--max-new-tokens", "4", "--out", str(out), *flags])


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def test_reward_functions_score_a_rollout_as_they_score_training(tiny_model_dir, tmp_path, catch, capsys):
    env, data = catch
    out = tmp_path / "scored"
    assert rollout(tiny_model_dir, env, data, out, "--reward", f"{env}:catch_reward") == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("2 episodes, 2 turns, mean reward 1.000, errors none, ")
    assert [r["reward"] for r in records(out)] == [1.0, 1.0]
    assert [r["total_reward"] for r in records(out)] == [0.0, 0.0]  # the environment's own
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mean_reward"] == 1.0 and metrics["reward_functions"] == {"catch_reward": 1.0}


def test_a_rollout_nothing_scores_says_so_instead_of_reporting_zeros(tiny_model_dir, tmp_path, catch, capsys):
    env, data = catch
    out = tmp_path / "unscored"
    assert rollout(tiny_model_dir, env, data, out) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("2 episodes, 2 turns, no reward, errors none, ")
    assert line.endswith(
        "; nothing scored the episodes: the environment class Catch has no get_reward() and no reward "
        "function was given (--reward module.py:function)"
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mean_total_reward"] is None and metrics["mean_reward"] is None
    assert metrics["no_reward"].startswith("the environment class Catch has no get_reward()")
    assert "reward" not in records(out)[0]


def test_a_used_out_is_refused_unless_overwrite(tiny_model_dir, tmp_path, catch, capsys):
    env, data = catch
    out = tmp_path / "out"
    flags = ("--reward", f"{env}:catch_reward", "--episodes", "1")
    assert rollout(tiny_model_dir, env, data, out, *flags) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("1 episode, 1 turn, mean reward 1.000, ")
    first = (out / "trajectories.jsonl").read_text()
    assert rollout(tiny_model_dir, env, data, out, *flags) == 2
    assert capsys.readouterr().err == (
        f"rollforge: error: --out '{out}' already holds a rollout (trajectories.jsonl, metrics.json); "
        "start over with --overwrite (deletes it) or give another --out\n"
    )
    assert (out / "trajectories.jsonl").read_text() == first  # nothing was touched
    (out / "notes.txt").write_text("mine")
    assert rollout(tiny_model_dir, env, data, out, "--reward", f"{env}:catch_reward", "--overwrite") == 0
    assert len(records(out)) == 2 and (out / "notes.txt").read_text() == "mine"  # only the rollout's files go


def test_eval_runs_the_readme_counter_from_data(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--model", str(tiny_model_dir), "--env", f"{EXAMPLES / 'counter_env.py'}:Counter"]
    argv += ["--data", str(EXAMPLES / "counter_prompts.jsonl"), "--episodes", "3", "--max-new-tokens", "8"]
    assert main([*argv, "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 3 and list(result["per_task"]) == ["Counter"] and 0 <= result["mean_reward"] <= 1
    assert len(records(out)) == 3


def test_eval_takes_reward_functions_and_refuses_what_nothing_scores(tiny_model_dir, tmp_path, catch, capsys):
    env, data = catch
    argv = [
        "eval",
        "--model",
        str(tiny_model_dir),
        "--env",
        f"{env}:Catch",
        "--data",
        str(data),
        "--max-new-tokens",
        "4",
    ]
    assert main([*argv, "--reward", f"{env}:catch_reward"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 2 and result["mean_reward"] == 1.0 and result["pass_at_k"] == {"1": 1.0}
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(
        "rollforge: error: nothing would score the evaluation: the environment class Catch has no get_reward()"
    )


def without(modules: list[str], argv: list[str]) -> subprocess.CompletedProcess:
    """``rollforge ARGV`` in a fresh interpreter where ``modules`` cannot be imported (not installed)."""
    code = f"import sys\nfor m in {modules!r}: sys.modules[m] = None\nfrom rollforge.cli.main import main\nsys.exit(main({argv!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_missing_task_library_is_one_line_naming_its_extra(tmp_path):
    run = without(["textarena"], ["rollout", "--env", "textarena:GuessTheNumber-v0", "--out", str(tmp_path / "o")])
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (
        "rollforge: error: the textarena environments needs the optional dependency 'textarena', which is not "
        "installed; install it with: pip install 'rollforge[textarena]'\n"
    )


def test_env_list_without_the_task_libraries_lists_what_it_can_and_names_the_extras():
    run = without(["reasoning_gym", "textarena", "gymnasium"], ["env", "list"])
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(None, 1) for line in run.stdout.splitlines())
    assert lines["arithmetic"].startswith("One-digit addition")
    assert lines["reasoning_gym:leg_counting"] == "(needs its library: pip install 'rollforge[reasoning-gym]')"
    assert lines["textarena:Mastermind-v0"] == "(needs its library: pip install 'rollforge[textarena]')"
    assert lines["gymnasium:CliffWalking-v1"] == "(needs its library: pip install 'rollforge[gymnasium]')"
