"""The run viewer: the payload read from rollout and training runs, the self-contained page, and
(slow) the page rendered by headless Chromium."""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import get_parser
from rollforge.cli.main import main
from rollforge.cli.rollout_results import write_results
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.models import load_tokenizer
from rollforge.recipes.sft_data import expert_backend
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import rollout
from rollforge.view import render_html, write_view
from rollforge.view.run import CHUNK, load_run, tokenizer_for

BAD_CALL = '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>'


def unpack(blob: str):
    return json.loads(gzip.decompress(base64.b64decode(blob)))


@pytest.fixture(scope="module")
def rollout_run(tiny_model_dir, tmp_path_factory):
    """A real catch rollout through the engine: the expert plays, but every 5th request writes a
    call with a direction the schema rejects (a counted tool failure)."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    renderer = ChatRenderer(tokenizer)
    spec = get_env_spec("catch")
    expert = expert_backend(spec.expert, renderer, get_parser())._script

    def script(request):
        return BAD_CALL if request.call % 5 == 0 else expert(request)

    result = rollout(
        spec.samples(120, 0),
        {"catch": spec.build()},
        ScriptedBackend(script, tokenizer),
        renderer,
        RolloutConfig(max_turns=6),
    )
    out = tmp_path_factory.mktemp("rollout-run")
    write_results(out, result.trajectories, result.metrics)
    return out, result.trajectories


def test_rollout_payload_keeps_every_token_mask_and_logprob(rollout_run, tiny_model_dir):
    run, trajectories = rollout_run
    payload = load_run(run, load_tokenizer(str(tiny_model_dir)))
    summary = payload.summary
    assert (
        summary["kind"] == "rollout"
        and len(summary["rows"]) == 120
        and summary["metrics"]["mean_total_reward"] is not None
    )
    assert len(payload.chunks) == 120 // CHUNK + 1
    columns = summary["columns"]
    failed = [r for r in summary["rows"] if r[columns.index("failures")]]
    assert failed and all(r[columns.index("failures")] == ["tool_bad_arguments"] for r in failed)
    details = [d for chunk in payload.chunks for d in unpack(chunk)]
    for t, d in zip(trajectories, details):
        assert d["ids"] == list(t.token_ids)
        mask, bit = [], 0
        for run_length in d["runs"]:  # alternating runs of 0s and 1s, starting with 0s
            mask += [bit] * run_length
            bit = 1 - bit
        assert mask == list(t.loss_mask)
        assert d["logprobs"] == [round(lp, 4) for lp in t.logprobs if lp is not None]
    vocab = unpack(payload.vocab)
    assert "".join(vocab[str(i)] for i in trajectories[0].token_ids) == ChatRenderer(
        load_tokenizer(str(tiny_model_dir))
    ).decode(trajectories[0].token_ids)


def test_training_run_payload_has_steps_curve_and_advantages(tmp_path, rollout_run):
    _, trajectories = rollout_run
    (tmp_path / "trajectories").mkdir()
    for step in (1, 2):
        records = [
            {
                **t.to_json(),
                "reward": 0.25 * step,
                "advantage": -0.5,
                "retries": step - 1,
                "versions": [step - 1] * sum(t.loss_mask),
            }
            for t in trajectories[:3]
        ]
        records[2]["error"] = {"kind": "env_error" if step == 1 else "invalid_action", "message": "x"}
        (tmp_path / "trajectories" / f"step-{step:06d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records)
        )
    (tmp_path / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "reward/mean": 0.25 * s, "reward/env/catch": 0.25 * s, "loss": float("nan")}) + "\n"
            for s in (1, 2)
        )
        + '{"step": 3, "rew'  # torn by a kill
    )
    evaluation = {"episodes": 4, "pass_at_k": {}}
    (tmp_path / "eval.json").write_text(
        json.dumps(
            {
                "before_warmup": {**evaluation, "mean_reward": 0.0, "per_task": {"catch": 0.0}},  # not this run's curve
                "after": {**evaluation, "mean_reward": 0.75, "per_task": {"catch": 0.75}, "weight_version": 2},
                "before": {**evaluation, "mean_reward": 0.25, "per_task": {"catch": 0.25}, "weight_version": 0},
                "step-1": {**evaluation, "mean_reward": 0.5, "per_task": {"catch": 0.5}, "weight_version": 1},
            }
        )
    )
    payload = load_run(tmp_path)
    summary = payload.summary
    assert summary["held_out"] == [
        {"step": 0, "mean": 0.25, "catch": 0.25},
        {"step": 1, "mean": 0.5, "catch": 0.5},
        {"step": 2, "mean": 0.75, "catch": 0.75},
    ]
    details = [d for chunk in payload.chunks for d in unpack(chunk)]
    assert [d["outcome"] for d in details] == ["completed", "completed", "infra_failure"] * 1 + [
        "completed",
        "completed",
        "policy_failure",
    ]
    assert [d["retries"] for d in details] == [0, 0, 0, 1, 1, 1]
    assert details[3]["versions"] == [1] * sum(trajectories[0].loss_mask)
    c = summary["columns"]
    assert summary["kind"] == "training" and [r[c.index("step")] for r in summary["rows"]] == [1, 1, 1, 2, 2, 2]
    assert [r[c.index("reward")] for r in summary["rows"]][2:4] == [0.25, 0.5] and summary["rows"][0][
        c.index("adv")
    ] == -0.5
    assert [m["step"] for m in summary["curve"]] == [1, 2]
    assert payload.vocab is None
    html = render_html(payload)
    assert '"loss":null' in html  # NaN is not JSON: it becomes null


def test_page_is_self_contained_and_data_cannot_break_out(tmp_path, rollout_run):
    _, trajectories = rollout_run
    record = trajectories[0].to_json()
    record["messages"][1]["content"] = "</script><script>alert(1)</script> /*JS*/ <!--BLOBS-->"
    (tmp_path / "trajectories.jsonl").write_text(json.dumps(record) + "\n")
    path = write_view(tmp_path)
    html = path.read_text()
    assert path == tmp_path / "view.html"
    assert len(re.findall(r"<script\b", html)) == 3  # summary, one detail blob, the viewer code
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html) and "@import" not in html
    assert "fetch(" not in html and "XMLHttpRequest" not in html
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="not a run directory"):
        load_run(tmp_path / "empty")


def test_view_command_writes_the_file(tmp_path, rollout_run, capsys):
    run, _ = rollout_run
    out = tmp_path / "page.html"
    assert main(["view", str(run), "--out", str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert main(["view", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- in a browser ----------------------------------------------------------------------------------------


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("headless Chromium is not installed (apt-get install -y chromium; scripts/install.sh does it)")


def rendered_dom(page: Path, fragment: str = "") -> str:
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.resolve().as_uri() + fragment,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_chromium_renders_the_rollout_view(rollout_run, tiny_model_dir, tmp_path):
    run, trajectories = rollout_run
    page = write_view(run, tmp_path / "view.html", model=str(tiny_model_dir))
    bad = next(i for i, t in enumerate(trajectories) if t.failures)
    dom = rendered_dom(page, f"#episode={bad}")
    assert re.search(r'id="count">120 of 120 episodes<', dom)
    assert len(re.findall(r'<tr data-i="\d+"', dom)) == 50  # one page of the list
    assert f'data-detail="{bad}"' in dom
    policy = re.findall(r'<span class="t m1" title="#(\d+) id (\d+) · logprob (-?[\d.]+)">', dom)
    t = trajectories[bad]
    assert len(policy) == sum(t.loss_mask)
    position, token, logprob = policy[0]
    assert t.loss_mask[int(position)] == 1 and t.token_ids[int(position)] == int(token)
    assert float(logprob) == pytest.approx(t.logprobs[int(position)], abs=1e-3)
    assert len(re.findall(r'<span class="t m0" title=', dom)) == len(t.token_ids) - sum(t.loss_mask)
    assert re.search(r'<div class="call">⚙ move\(\{"direction":"(left|right|stay)"\}\)</div>', dom)
    assert "tool_bad_arguments" in dom and "turn 1 reward" in dom


@pytest.mark.slow
def test_chromium_renders_a_training_run_with_its_curve(tiny_model_dir, tmp_path):
    from rollforge.recipes.launch import train
    from rollforge.testing import first_character_rows
    from rollforge.train.config import load_config

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in first_character_rows(16)))
    config = load_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'run'}",
            "steps=3",
            f"data.path={prompts}",
            "environments=[{name: 'rollforge.testing:FirstCharacter', task_name: first}]",
            "algorithm.batch_size=4",
            "algorithm.group_size=8",
            "rollout.max_new_tokens=2",
            "rollout.max_turns=1",
            "checkpoint_every=0",
            "algorithm.max_staleness=1",
            "eval_episodes=4",
            "eval_every=1",
        ]
    )
    result = train(config, console=False)
    assert sorted(result.evaluations) == ["after", "before", "step-1", "step-2"]
    page = write_view(result.out)  # the run's config.yaml names the tokenizer
    dom = rendered_dom(page)
    assert re.search(r'id="count">96 of 96 episodes<', dom)  # 3 steps x 4 prompts x 8 rollouts
    assert dom.count('<polyline class="series" data-key="reward/mean"') == 1
    assert dom.count('<polyline class="series" data-key="mean"') == 1  # the held-out curve: before, steps 1-2, after
    assert re.search(r'<span class="t m1" title="#\d+ id \d+ · logprob -?[\d.]+ · weight version \d"', dom)
    assert "outcome <b>completed</b>" in dom
    assert len(re.findall(r'<tr data-step="\d"', dom)) == 3
    assert '<span class="t m1" title="#' in dom


# -- a trajectories file, or a directory of them ---------------------------------------------------------


def test_view_takes_a_trajectories_file(tmp_path, rollout_run, capsys):
    run, trajectories = rollout_run
    file = tmp_path / "rollout" / "trajectories.jsonl"
    file.parent.mkdir()
    shutil.copy(run / "trajectories.jsonl", file)
    shutil.copy(run / "metrics.json", tmp_path / "rollout" / "metrics.json")
    assert main(["view", str(file)]) == 0
    assert f"wrote {tmp_path / 'rollout' / 'trajectories.html'}" in capsys.readouterr().out
    payload = load_run(file)
    assert payload.summary["title"] == "rollout/trajectories.jsonl"
    assert len(payload.summary["rows"]) == len(trajectories)
    assert payload.summary["metrics"] == json.loads((run / "metrics.json").read_text())


def test_view_takes_a_directory_of_step_files_and_finds_the_runs_tokenizer(tmp_path, rollout_run, tiny_model_dir):
    run, trajectories = rollout_run
    steps = tmp_path / "train" / "trajectories"
    steps.mkdir(parents=True)
    lines = (run / "trajectories.jsonl").read_text().splitlines(keepends=True)
    (steps / "step-000001.jsonl").write_text("".join(lines[:3]))
    (steps / "step-000002.jsonl").write_text("".join(lines[3:5]))
    (tmp_path / "train" / "config.yaml").write_text(f"model:\n  name: {tiny_model_dir}\n")
    rows = load_run(steps).summary["rows"]
    assert [row[1] for row in rows] == [1, 1, 1, 2, 2]  # the step column, from the file names
    assert tokenizer_for(steps / "step-000002.jsonl", None).name_or_path == str(tiny_model_dir)


def test_a_path_that_is_not_a_run_says_whether_it_is_missing_or_the_wrong_kind(tmp_path, capsys):
    missing = tmp_path / "runs" / "trajectories.jsonl"
    assert main(["view", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"rollforge: error: {str(missing)!r} does not exist; expected a run directory or a trajectories .jsonl file\n"
    )
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    assert main(["view", str(notes)]) == 2
    assert capsys.readouterr().err == (
        f"rollforge: error: {str(notes)!r} is not a run directory or a trajectories file: expected a directory with "
        "trajectories.jsonl (a rollout) or metrics.jsonl (a training run), a .jsonl file of trajectories or a "
        "directory of them\n"
    )
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 0.5}\n')
    assert main(["view", str(metrics)]) == 2
    assert capsys.readouterr().err == (
        f"rollforge: error: {str(metrics)!r} holds no trajectories: expected records with token_ids and loss_mask, "
        "as trajectories.jsonl holds\n"
    )
