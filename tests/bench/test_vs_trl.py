"""The pieces of ``rollforge bench vs-trl``: the environment, the tiny tool-calling model's tokenizer,
template and warm-up loss, and (with the ``bench-trl`` extra) a two-step run of both trainers."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from rollforge import FactoryEnvironment, check_env
from rollforge.bench.vs_trl import env as env_module
from rollforge.bench.vs_trl import model as setup
from rollforge.chat.render import ChatRenderer
from rollforge.envs.tools import discover_tools
from rollforge.types import Message, Sample


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    return setup.build_tokenizer([env_module.render(env_module.scripted_episode(rng)) for _ in range(40)])


def test_guess_number_tools_and_reward():
    env = env_module.GuessNumber()
    assert env.reset(secret=6, prompt=[]) is None
    assert (env.hint("parity"), env.hint("size")) == ("even", "large")
    with pytest.raises(ValueError, match="parity"):
        env.hint("colour")
    assert [env.guess(3), env.guess(7)] == ["higher", "lower"]
    assert env.get_reward() == 0.0
    assert env.guess(6) == "correct"
    assert env.get_reward() == 1.0
    assert sorted(discover_tools(env)) == ["guess", "hint"]


def test_both_libraries_render_the_same_tool_list():
    from transformers.utils import get_json_schema

    ours = [t.schema() for t in discover_tools(env_module.GuessNumber()).values()]
    assert ours == [get_json_schema(method) for method in env_module.tool_methods()]


def test_guess_number_passes_check_env():
    rows = env_module.prompt_rows(4)
    samples = [Sample(prompt=(Message("user", env_module.USER_PROMPT),), row={"secret": r["secret"]}) for r in rows]
    check_env(FactoryEnvironment(env_module.GuessNumber), samples=samples)


def test_prompt_rows_cycle_through_every_secret():
    rows = env_module.prompt_rows(16, seed=3)
    assert sorted(r["secret"] for r in rows) == sorted(list(range(1, env_module.MAX_SECRET + 1)) * 2)
    assert all(r["prompt"] == [{"role": "user", "content": env_module.USER_PROMPT}] for r in rows)


def test_scripted_episodes_are_consistent_games():
    for seed in range(20):
        messages = env_module.scripted_episode(random.Random(seed))
        calls = [m for m in messages if m.get("tool_calls")]
        assert 1 <= len(calls) <= env_module.MAX_TOOL_CALLS
        assert messages[-1]["role"] == "assistant" and "tool_calls" not in messages[-1]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert ("correct" in results) == messages[-1]["content"].startswith("The secret number is")


def test_tokenizer_specials_and_markers(tokenizer):
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(3)] == list(setup.SPECIAL_TOKENS)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for marker in setup.MARKER_TOKENS:
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1
    text = env_module.render(env_module.scripted_episode(random.Random(1)))
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_rollforge_renders_the_template_with_tools(tokenizer):
    renderer = ChatRenderer(tokenizer)
    tools = tuple(t.schema() for t in discover_tools(env_module.GuessNumber()).values())
    prompt = (Message("user", env_module.USER_PROMPT),)
    assert renderer.check_template(prompt, tools).incremental  # turns are appended
    assert renderer.stop_token_ids[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = renderer.decode(renderer.prompt_ids(prompt, tools))
    assert "<tools>" in text and '"name": "guess"' in text and '"name": "hint"' in text


def test_assistant_labels_cover_exactly_what_the_model_writes(tokenizer):
    messages = [
        {"role": "user", "content": env_module.USER_PROMPT},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "guess", "arguments": {"number": 4}}}],
        },
        {"role": "tool", "name": "guess", "content": "higher"},
        {"role": "assistant", "content": "The secret number is 5."},
    ]
    ids, labels = setup.assistant_labels(tokenizer, messages)
    assert len(ids) == len(labels)
    labelled = tokenizer.decode([t for t in labels if t != -100])
    assert labelled == (
        '<tool_call>\n{"name": "guess", "arguments": {"number": 4}}\n</tool_call><|im_end|>'
        "The secret number is 5.<|im_end|>"
    )


def test_shared_prefix_loss_equals_the_full_sequence_loss(tokenizer):
    model = setup.build_model(tokenizer, seed=0)
    rng = random.Random(2)
    prefix = tokenizer(
        env_module.render([{"role": "user", "content": env_module.USER_PROMPT}]), add_special_tokens=False
    )["input_ids"]
    full = [setup.assistant_labels(tokenizer, env_module.scripted_episode(rng)) for _ in range(3)]
    batch = [(ids[len(prefix) :], labels[len(prefix) :]) for ids, labels in full]
    shared = setup.shared_prefix_loss(model, prefix, batch, tokenizer.pad_token_id)
    # The reference: each whole sequence through the model, right-padded, with transformers' own loss.
    width = max(len(ids) for ids, _ in full)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in full])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in full])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in full])
    reference = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
    assert shared.item() == pytest.approx(reference.item(), abs=1e-5)


def test_prepare_model_caches_by_recipe(tmp_path):
    first = setup.prepare_model(tmp_path, warmup_steps=2)
    assert (first / "warmup.json").is_file() and (first / "config.json").is_file()
    assert setup.prepare_model(tmp_path, warmup_steps=2) == first
    assert setup.prepare_model(tmp_path, warmup_steps=3) != first


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")
def test_template_is_trls_qwen25():
    from trl.chat_template_utils import qwen2_5_chat_template

    assert env_module.QWEN25_TEMPLATE == qwen2_5_chat_template


def test_arithmetic_reward_scores_like_the_environment():
    from rollforge.bench.vs_trl.workloads import arithmetic_reward

    completions = [
        [{"role": "assistant", "content": "3 + 4 = 7"}],
        [{"role": "assistant", "content": "It is 8."}],
        [{"role": "assistant", "content": "no idea"}],
    ]
    metadata = [{"a": 3, "b": 4, "answer": 7}] * 3
    assert arithmetic_reward(completions, metadata, prompts=None) == [1.0, 0.0, 0.0]


def test_settings_take_the_workload_defaults_unless_given():
    import argparse

    from rollforge.bench import vs_trl
    from rollforge.errors import ConfigError

    parser = argparse.ArgumentParser()
    vs_trl.add_arguments(parser)
    settings = vs_trl.settings_from(parser.parse_args(["--generations", "8"]))
    assert (settings.batch_size, settings.generations, settings.max_completion_tokens) == (2, 8, 32)
    assert settings.max_tool_calls == 0 and settings.steps == 6
    tools = vs_trl.settings_from(parser.parse_args(["--workload", "guess-number"]))
    assert (tools.batch_size, tools.max_completion_tokens, tools.max_tool_calls) == (4, 128, 4)
    with pytest.raises(ConfigError, match="--max-tool-calls applies to the guess-number workload"):
        vs_trl.settings_from(parser.parse_args(["--max-tool-calls", "2"]))


def test_backend_staleness_and_best_options_reach_the_settings():
    import argparse

    from rollforge.bench import vs_trl

    parser = argparse.ArgumentParser()
    vs_trl.add_arguments(parser)
    plain = vs_trl.settings_from(parser.parse_args([]))
    assert (plain.backend, plain.max_staleness, plain.candidates) == ("hf", 0, ())
    settings = vs_trl.settings_from(
        parser.parse_args(
            [
                "--backend",
                "vllm",
                "--max-staleness",
                "1",
                "--best",
                "--best-steps",
                "2",
                "--candidates",
                "trl-hf, rollforge-hf-async1",
            ]
        )
    )
    assert (settings.backend, settings.max_staleness, settings.best_steps) == ("vllm", 1, 2)
    assert settings.candidates == ("trl-hf", "rollforge-hf-async1")
    defaults = vs_trl.settings_from(parser.parse_args(["--best"]))
    assert defaults.candidates == tuple(vs_trl.CANDIDATES)
    # four: an asynchronous candidate's last step (nothing generating beside it) is one timed step of three
    assert defaults.best_steps == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-staleness", "-1"], "--max-staleness must be 0 (synchronous) or more, got -1"),
        (
            ["--best", "--candidates", "trl-hf,rollforge-fast"],
            "--candidates: unknown candidate 'rollforge-fast'; expected names from",
        ),
        (["--best", "--candidates", "trl-hf"], "--candidates 'trl-hf' names no rollforge candidate"),
        (["--best", "--best-steps", "1"], "--best-steps must be at least 2"),
        (["--candidates", "trl-hf"], "--best-steps and --candidates apply with --best only"),
    ],
)
def test_a_bad_vs_trl_option_is_one_line(argv, message, capsys):
    from rollforge.cli.main import main

    assert main(["bench", "vs-trl", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rollforge: error: {message}") and err.count("\n") == 1


def test_turns_alternate_strictly():
    import threading

    from rollforge.bench.vs_trl.runners import Turns

    turns, events = Turns(), []
    hook = turns.rollforge_hook(last_step=3)

    def rollforge():
        turns.wait(turns.rollforge_turn)
        for step in (1, 2, 3):
            events.append(f"rf{step}")
            hook(step)
        turns.rollforge_done.set()

    thread = threading.Thread(target=rollforge)
    thread.start()
    for step in (1, 2, 3):  # what TRL's on_step_begin / on_step_end do
        turns.wait(turns.trl_turn)
        events.append(f"trl{step}")
        turns.rollforge_turn.set()
    turns.wait(turns.rollforge_done)
    thread.join(5)
    assert events == ["trl1", "rf1", "trl2", "rf2", "trl3", "rf3"]


def _tiny_settings(**changes):
    from rollforge.bench.vs_trl.settings import Settings

    return Settings(steps=2, batch_size=2, generations=2, max_completion_tokens=16, lr=1e-4, **changes)


def _check_result(result, completions, max_tokens):
    assert result["ratio_step_time"] > 0
    for side in ("trl", "rollforge"):
        summary = result[side]
        assert summary["timed_steps"] == 1
        assert len(result["learning_curves"][side][0]) == 2
        assert 0 < summary["generated_tokens_per_step"] <= completions * max_tokens
        phases = summary["phases_seconds_per_step"]
        assert phases["generation"] > 0 and phases["update"] > 0 and phases["other"] >= 0
        assert sum(phases.values()) == pytest.approx(summary["seconds_per_step"], abs=2e-3)
    assert result["trl"]["prompt_tokens"] == result["rollforge"]["prompt_tokens"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")
def test_both_trainers_run_arithmetic_and_are_timed(tmp_path):
    from rollforge.bench import vs_trl
    from rollforge.bench.vs_trl.workloads import arithmetic
    from rollforge.testing import make_tiny_model

    workload = arithmetic(make_tiny_model(tmp_path / "model"))
    result = vs_trl.run(workload, _tiny_settings(), out=str(tmp_path / "out"))
    _check_result(result, completions=4, max_tokens=16)
    assert result["settings"]["completions_per_step"] == 4 and result["settings"]["workload"] == "arithmetic"
    assert result["trl"]["tool_calls_per_step"] == result["rollforge"]["tool_calls_per_step"] == 0
    assert (tmp_path / "out" / "result.json").is_file()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")
def test_both_trainers_run_the_tool_game_and_are_timed(tmp_path):
    from rollforge.bench import vs_trl
    from rollforge.bench.vs_trl.workloads import guess_number

    workload = guess_number(model_dir=setup.prepare_model(tmp_path / "cache", warmup_steps=2))
    result = vs_trl.run(workload, _tiny_settings(max_tool_calls=1))
    _check_result(result, completions=4, max_tokens=16 * 2)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")
def test_best_reports_both_ratios_and_every_candidate(tmp_path):
    from rollforge.bench import vs_trl
    from rollforge.bench.vs_trl.workloads import arithmetic
    from rollforge.testing import make_tiny_model

    workload = arithmetic(make_tiny_model(tmp_path / "model"))
    settings = _tiny_settings(
        backend="hf", max_staleness=0, best_steps=2, candidates=("trl-hf", "rollforge-hf-sync", "rollforge-hf-async1")
    )
    result = vs_trl.run(workload, settings)
    assert result["ratio_step_time"] > 0 and result["ratio_step_time_best"] > 0
    candidates = result["candidates"]
    configurations = {name: dict(c["configuration"]) for name, c in candidates.items()}
    sampling = {name: c.pop("sampling") for name, c in configurations.items()}
    assert configurations["rollforge-hf-async1"] == {"backend": "hf", "max_staleness": 1}
    assert configurations["rollforge-hf-sync"] == {"backend": "hf", "max_staleness": 0}
    assert configurations["trl-hf"] == {"generation": "model.generate"}
    # both sides sample the same distribution: the full softmax at the workload's temperature
    assert sampling["trl-hf"] == sampling["rollforge-hf-sync"] == sampling["rollforge-hf-async1"]
    for candidate in candidates.values():
        assert len(candidate["step_seconds"]) == 2 and set(candidate["phases_seconds_per_step"]) == set(vs_trl.PHASES)
    assert result["best_trl"]["candidate"] == "trl-hf"
    chosen = result["best_rollforge"]["candidate"]
    assert candidates[chosen]["seconds_per_step"] == min(
        candidates[n]["seconds_per_step"] for n in ("rollforge-hf-sync", "rollforge-hf-async1")
    )
    assert (
        result["best_rollforge"]["timed_steps"] == 1
        and result["best_rollforge"]["configuration"] == candidates[chosen]["configuration"]
    )
    assert result["ratio_step_time_best"] == pytest.approx(
        result["best_rollforge"]["seconds_per_step"] / result["best_trl"]["seconds_per_step"], abs=1e-3
    )


def test_a_candidate_that_sets_torchrun_variables_leaves_the_process_as_it_was(tmp_path, monkeypatch):
    """TRL's colocated vLLM sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the process; after
    `vs-trl --best`, every later `train()` in it took itself for a torchrun rank (CI: Ray training
    ran in-process and alone). Each candidate's changes to os.environ are undone."""
    import os

    from rollforge.bench.vs_trl import best

    for key in ("WORLD_SIZE", "RANK", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)

    def runner(workload, settings, folder):
        os.environ.update(WORLD_SIZE="1", RANK="0", MASTER_PORT="29500")
        if settings.trl_vllm:
            raise RuntimeError("weight_loader")  # a candidate that fails after setting them
        return {}

    monkeypatch.setattr(best, "RUNNERS", {"trl": runner, "rollforge": runner})
    summary = {"configuration": {}, "seconds_per_step": 1.0, "phases_seconds_per_step": {}, "step_seconds": [1.0]}
    result = best.run_best(
        None,
        _tiny_settings(candidates=("rollforge-hf-sync", "trl-hf", "trl-vllm-colocate"), best_steps=2),
        tmp_path,
        lambda runs: summary,
    )
    assert result["ratio_step_time_best"] == 1.0 and "error" in result["candidates"]["trl-vllm-colocate"]
    assert not {"WORLD_SIZE", "RANK", "MASTER_PORT"} & set(os.environ)
