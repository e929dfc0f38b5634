"""``rollforge train``, ``quickstart`` and ``eval`` end to end on the tiny model."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from rollforge.cli.main import main
from rollforge.errors import ConfigError
from rollforge.inputs.evaluate import pass_at_k
from rollforge.testing import free_port


def test_train_from_yaml_with_overrides(tiny_config, tmp_path, capsys):
    config = tiny_config()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    assert main(["train", str(path), "--set", "steps=2", "--set", "algorithm.group_size=2"]) == 0
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert {
        "reward/mean",
        "loss",
        "kl",
        "clip_fraction",
        "grad_norm",
        "tokens_per_second",
        "time/rollout",
        "time/update",
        "advantage/zero_variance_groups",
        "reward/env/first",
        "rollout/mean_gen_tokens_per_sample",
    } <= set(lines[0])
    assert len((tmp_path / "run" / "trajectories" / "step-000002.jsonl").read_text().splitlines()) == 8  # 4 x 2
    assert "step    2/2  reward" in capsys.readouterr().err
    assert main(["train", str(path), "--set", "algorithm.batchsize=2"]) == 2
    assert "did you mean 'algorithm.batch_size'" in capsys.readouterr().err


def test_eval_every_evaluates_the_held_out_prompts_during_training_and_the_report_plots_them(tiny_config, tmp_path):
    from rollforge.recipes.launch import train
    from rollforge.train.report import write_report

    config = tiny_config().model_copy(update={"steps": 3, "eval_episodes": 2, "eval_every": 2})
    result = train(config, console=False)
    assert set(result.evaluations) == {"before", "step-2", "after"}  # step 3's is "after"
    assert [result.evaluations[k]["weight_version"] for k in ("before", "step-2", "after")] == [0, 2, 3]
    report = write_report(result.out, evaluations=result.evaluations).read_text()
    assert "![held-out greedy reward](held_out_curve.png)" in report
    assert (result.out / "held_out_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_config_lists_documented_keys(capsys):
    assert main(["train", "--help-config"]) == 0
    assert "algorithm.clip_high = 0.2  # Importance ratios above 1 + clip_high" in capsys.readouterr().out


def test_quickstart_writes_metrics_and_report(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "qs"
    code = main(
        [
            "quickstart",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--steps",
            "2",
            "--set",
            "eval_episodes=4",
            "--set",
            "rollout.max_new_tokens=4",
            "--set",
            "rollout.max_turns=2",
        ]
    )
    assert code == 0
    assert [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    report = (out / "report.md").read_text()
    assert "Held-out greedy evaluation (4 episodes)" in report and "calculator" in report
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    evaluations = json.loads((out / "eval.json").read_text())
    assert set(evaluations) == {"before_warmup", "before", "after"}  # before the warm-up, after it, after GRPO


def test_eval_reports_mean_reward_and_pass_at_k(tiny_model_dir, tmp_path, capsys):
    code = main(
        [
            "eval",
            "--model",
            str(tiny_model_dir),
            "--env",
            "arithmetic",
            "--episodes",
            "4",
            "--samples",
            "3",
            "--max-new-tokens",
            "3",
            "--out",
            str(tmp_path / "e"),
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 12 and set(result["pass_at_k"]) == {"1", "2", "3"}
    assert result["pass_at_k"]["1"] <= result["pass_at_k"]["2"] <= result["pass_at_k"]["3"]
    assert len((tmp_path / "e" / "trajectories.jsonl").read_text().splitlines()) == 12


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 3, 2) == 1.0
    with pytest.raises(ConfigError, match="k=5"):
        pass_at_k(4, 1, 5)


# --- user mistakes: one line on stderr, exit 2, no traceback, naming the bad value ---


def one_line_error(capsys, argv, *expected):
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("rollforge") and "Traceback" not in err, err
    for text in expected:
        assert text in err, err
    return err


@pytest.fixture
def config_file(tiny_config, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_config("steps=1").model_dump(mode="json")))
    return path


def test_train_mistakes_are_one_line(config_file, tmp_path, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("steps: 2\nalgorithm:\n  batch_size: [4, 8\n")
    one_line_error(capsys, ["train", str(bad_yaml)], f"config file {str(bad_yaml)!r} is not valid YAML", "line 4")
    one_line_error(capsys, ["train", str(config_file), "--set", "steps=[1"], "override 'steps=[1'")
    one_line_error(capsys, ["train", str(config_file), "--set", "steps=0"], "steps", "(got 0)")

    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"prompt": "Reply with a digit."}\n{"prompt": "Reply\n')
    one_line_error(
        capsys,
        ["train", str(config_file), "--set", f"data.path={bad_jsonl}"],
        f"{str(bad_jsonl)!r} line 2 is not valid JSON",
    )

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    one_line_error(capsys, ["train", str(config_file), "--set", f"out={a_file}"], f"out {str(a_file)!r} is a file")
    one_line_error(capsys, ["quickstart", "--out", str(a_file)], f"--out {str(a_file)!r} is an existing file")

    # today's prompts are ~40 tokens: nothing could be generated, so nothing could be trained
    one_line_error(
        capsys,
        ["train", str(config_file), "--set", "rollout.max_seq_len=16"],
        "rollout.max_seq_len=16 leaves no room to generate: prompt 1 is already",
    )

    url = f"http://127.0.0.1:{free_port()}"
    one_line_error(
        capsys,
        ["train", str(config_file), "--set", "model.backend=openai", "--set", f"model.base_url={url}"],
        f"no OpenAI-compatible server answers at {url}",
    )
    assert not (tmp_path / "run").exists()  # every one refused before the run directory was made


def test_eval_mistakes_are_one_line(tiny_model_dir, tmp_path, capsys):
    model = ["eval", "--model", str(tiny_model_dir)]
    one_line_error(capsys, [*model, "--episodes", "0"], "--episodes must be >= 1, got 0")
    one_line_error(capsys, [*model, "--samples", "-1"], "--samples must be >= 1, got -1")
    one_line_error(capsys, [*model, "--max-turns", "0"], "max_turns", "(got 0)")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    one_line_error(capsys, [*model, "--out", str(a_file)], f"--out {str(a_file)!r} is an existing file")
    one_line_error(capsys, [*model, "--episodes", "two"], "argument --episodes: invalid int value: 'two'")


class _Solver(BaseHTTPRequestHandler):
    """``/v1/completions`` of a server that adds: the prompt's last "What is a + b" answered right."""

    tokenizer = None
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        a, b = re.findall(r"What is (\d+) \+ (\d+)", self.tokenizer.decode(body["prompt"]))[-1]
        ids = self.tokenizer.encode(f"{int(a) + int(b)}<|im_end|>", add_special_tokens=False)
        payload = json.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": ids,
                        "finish_reason": "stop",
                        "logprobs": {"token_logprobs": [-0.25] * len(ids)},
                    }
                ]
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_eval_on_an_openai_compatible_server(tiny_model_dir, tmp_path, capsys):
    pytest.importorskip("httpx")
    from rollforge.models import load_tokenizer

    _Solver.tokenizer, _Solver.requests = load_tokenizer(tiny_model_dir), []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Solver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = main(
            [
                "eval",
                "--model",
                str(tiny_model_dir),
                "--env",
                "arithmetic",
                "--episodes",
                "5",
                "--backend",
                "openai",
                "--base-url",
                f"http://127.0.0.1:{server.server_port}",
                "--served-model-name",
                "solver",
                "--out",
                str(tmp_path / "e"),
            ]
        )
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 5 and result["mean_reward"] == 1.0 and result["pass_at_k"] == {"1": 1.0}
    assert len(_Solver.requests) == 5  # one single-turn episode each, all generated by the server
    assert {r["model"] for r in _Solver.requests} == {"solver"} and all(r["temperature"] == 0 for r in _Solver.requests)


def test_eval_against_a_server_that_is_down_is_one_line(tiny_model_dir, capsys):
    pytest.importorskip("httpx")
    url = f"http://127.0.0.1:{free_port()}"
    model = ["eval", "--model", str(tiny_model_dir)]
    one_line_error(
        capsys, [*model, "--backend", "openai", "--base-url", url], f"no OpenAI-compatible server answers at {url}"
    )
    one_line_error(
        capsys,
        [*model, "--backend", "openai", "--base-url", "http://127.0.0.1:1"],
        "no OpenAI-compatible server answers at http://127.0.0.1:1",
    )
    one_line_error(capsys, [*model, "--backend", "openai"], "the openai backend needs base_url")
    one_line_error(capsys, [*model, "--base-url", url], "base_url is only used by the openai backend, not by 'hf'")
