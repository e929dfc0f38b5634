"""`rollforge rollout` and `rollforge bench` end to end, on the tiny model and on real SmolLM2."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.cli.main import main
from rollforge.endings import ending_of
from rollforge.models import load_model
from rollforge.testing import first_character_rows, free_port
from rollforge.types import Failure, Message, Trajectory

FIELDS = {
    "index",
    "task_name",
    "messages",
    "token_ids",
    "loss_mask",
    "logprobs",
    "rewards",
    "total_reward",
    "turns",
    "terminated",
    "truncated",
    "max_turns_reached",
    "error",
}
SPEC_METRICS = {
    "total_turns",
    "avg_turns_per_sample",
    "max_turns_per_sample",
    "natural_termination_rate",
    "truncation_rate",
    "max_turns_reached_rate",
    "mean_total_tokens_per_sample",
    "mean_gen_tokens_per_sample",
    "mean_env_tokens_per_sample",
    "mean_total_reward",
    "max_total_reward",
    "min_total_reward",
}


def from_record(record: dict) -> Trajectory:
    """Rebuild a Trajectory from its JSON record (which re-checks every invariant)."""
    return Trajectory(
        index=record["index"],
        task_name=record["task_name"],
        messages=tuple(Message(m["role"], m["content"], name=m.get("name")) for m in record["messages"]),
        token_ids=tuple(record["token_ids"]),
        loss_mask=tuple(record["loss_mask"]),
        logprobs=tuple(record["logprobs"]),
        prompt_length=record["prompt_length"],
        rewards=tuple(record["rewards"]),
        total_reward=record["total_reward"],
        turns=record["turns"],
        ending=ending_of(record),
        error=Failure(**record["error"]) if record["error"] else None,
        tools=tuple(record["tools"]),
    )


def run_rollout(model: str, out, *extra: str) -> tuple[list[dict], dict]:
    args = [
        "rollout",
        "--model",
        model,
        "--env",
        "arithmetic",
        "--env",
        "catch",
        "--episodes",
        "4",
        "--max-turns",
        "3",
        "--max-new-tokens",
        "40",
        "--out",
        str(out),
        *extra,
    ]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    metrics = json.loads((out / "metrics.json").read_text())
    assert not (out / "trajectories.jsonl.partial").exists()
    return records, metrics


def check_records(records: list[dict], metrics: dict, renderer: ChatRenderer) -> list[Trajectory]:
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    assert [r["task_name"] for r in records] == ["arithmetic", "catch", "arithmetic", "catch"]
    assert all(FIELDS <= set(r) for r in records)
    assert SPEC_METRICS <= set(metrics) and metrics["episodes"] == 4
    trajectories = [from_record(r) for r in records]
    for t in trajectories:
        assert token_fidelity_gap(t, renderer) is None
    return trajectories


def test_rollout_cli_on_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    loops = []
    real_run = asyncio.run

    def counted_run(main, **kwargs):
        loops.append(main.__qualname__)
        return real_run(main, **kwargs)

    monkeypatch.setattr(asyncio, "run", counted_run)
    records, metrics = run_rollout(str(tiny_model_dir), tmp_path / "run", "--mode", "lockstep", "--seed", "3")
    assert loops == ["_rollout"]  # one event loop runs the backend, the environments and the rollout
    _, tokenizer = load_model(tiny_model_dir)
    check_records(records, metrics, ChatRenderer(tokenizer))
    again, _ = run_rollout(str(tiny_model_dir), tmp_path / "again", "--mode", "lockstep", "--seed", "3")
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in records]  # deterministic for a seed


def test_rollout_cli_reports_bad_input(tmp_path, capsys):
    assert main(["rollout", "--env", "no-such-env", "--out", str(tmp_path)]) == 2
    assert "no-such-env" in capsys.readouterr().err


def test_bench_overhead_prints_its_ratio(capsys):
    assert main(["bench", "overhead", "--episodes", "32", "--turns", "3", "--latency", "0.05"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["turns_completed"] == 96 and result["errors"] == {} and result["tool_failures"] == {}
    assert result["ratio_to_lower_bound"] >= 1.0


@pytest.mark.slow
def test_rollout_cli_on_smollm2_is_token_exact_and_logprob_faithful(smollm2_dir, tmp_path):
    records, metrics = run_rollout("smollm2-135m", tmp_path / "first")
    model, tokenizer = load_model(smollm2_dir)
    trajectories = check_records(records, metrics, ChatRenderer(tokenizer))
    differences = []
    for t in trajectories:
        ids = torch.tensor([t.token_ids])
        with torch.inference_mode():
            logits = model(ids).logits.float()  # (1, T, V)
        logprobs = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]  # (T-1,)
        for position, stored in enumerate(t.logprobs):
            if stored is not None:
                differences.append(abs(logprobs[position - 1].item() - stored))
    assert len(differences) == sum(t.generated_tokens for t in trajectories) > 0
    assert sum(differences) / len(differences) < 1e-3


COUNTER = '''
class Counter:
    def reset(self, **row):
        self.total = 0

    def add(self, n: int) -> str:
        """Add to the total.

        Args:
            n: how much to add
        """
        self.total += n
        return str(self.total)
'''


def test_rollout_takes_files_modules_and_a_prompts_file(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cli_counter.py").write_text(COUNTER)
    rows = [{**row, "task_name": "FirstCharacter"} for row in first_character_rows(2)]
    rows += [{"prompt": "Count to three.", "environment": "Counter"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "rollout",
        "--model",
        str(tiny_model_dir),
        "--env",
        "rollforge.testing:FirstCharacter",
        "--env",
        "cli_counter.py:Counter",
        "--data",
        "rows.jsonl",
        "--max-new-tokens",
        "3",
        "--out",
        "out",
    ]
    assert main([*args, "--episodes", "5"]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    # five episodes from three rows, cycling through the file
    assert [r["task_name"] for r in records] == [
        "FirstCharacter",
        "FirstCharacter",
        "Counter",
        "FirstCharacter",
        "FirstCharacter",
    ]
    assert all(r["error"] is None for r in records)
    assert [m["content"] for m in records[2]["messages"] if m["role"] == "user"] == ["Count to three."]


def rollout_error(capsys, *argv):
    capsys.readouterr()
    code = main(["rollout", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_rollout_mistakes_are_one_line(tiny_model_dir, tmp_path, capsys):
    model = ["--model", str(tiny_model_dir), "--episodes", "1"]
    out = ["--out", str(tmp_path / "out")]
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert f"--out {str(a_file)!r} is an existing file" in rollout_error(capsys, *model, "--out", str(a_file))
    assert "--episodes must be >= 1, got 0" in rollout_error(capsys, "--episodes", "0", *out)
    assert "max_turns" in rollout_error(capsys, *model, *out, "--max-turns", "0")
    assert "--max-seq-len=8 leaves no room to generate: prompt 1 is already" in rollout_error(
        capsys, *model, *out, "--max-seq-len", "8"
    )
    assert "unknown tool-call parser 'nope'" in rollout_error(capsys, *model, *out, "--tool-parser", "nope")
    assert "argument --max-turns: invalid int value: 'many'" in rollout_error(capsys, *out, "--max-turns", "many")
    url = f"http://127.0.0.1:{free_port()}"
    assert f"no OpenAI-compatible server answers at {url}" in rollout_error(
        capsys, *model, *out, "--backend", "openai", "--base-url", url
    )
    (tmp_path / "env.py").write_text(COUNTER)
    env = ["--env", f"{tmp_path / 'env.py'}:Counter"]
    assert "has no prompt generator; give prompts with --data" in rollout_error(capsys, *model, *out, *env)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n\n{"prompt": \n')
    assert f"{str(bad)!r} line 3 is not valid JSON" in rollout_error(capsys, *model, *out, *env, "--data", str(bad))
    assert not (tmp_path / "out").exists()
