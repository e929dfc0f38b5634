"""The pieces of ``rollforge bench vs-trl``: the environment, the tiny tool-calling model's tokenizer,
template and warm-up loss, and (with the ``bench-trl`` extra) a two-step run of both trainers."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from rollforge import FactoryEnvironment, check_env
from rollforge.bench import vs_trl_env as env_module
from rollforge.bench import vs_trl_setup as setup
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
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "guess", "arguments": {"number": 4}}}]},
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
    prefix = tokenizer(env_module.render([{"role": "user", "content": env_module.USER_PROMPT}]), add_special_tokens=False)["input_ids"]
    full = [setup.assistant_labels(tokenizer, env_module.scripted_episode(rng)) for _ in range(3)]
    batch = [(ids[len(prefix):], labels[len(prefix):]) for ids, labels in full]
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


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs the bench-trl extra (trl)")
def test_both_trainers_run_and_are_timed(tmp_path, monkeypatch):
    from rollforge.bench import vs_trl

    model_dir = setup.prepare_model(tmp_path / "cache", warmup_steps=2)
    monkeypatch.setattr(vs_trl, "prepare_model", lambda: model_dir)
    settings = {"steps": 2, "rounds": 1, "batch_size": 2, "generations": 2, "max_completion_tokens": 16,
                "max_tool_calls": 1, "lr": 1e-4, "seed": 0}
    result = vs_trl.run(settings, out=str(tmp_path / "out"))
    assert result["ratio_step_time"] > 0
    for side in ("trl", "rollforge"):
        assert result[side]["timed_steps"] == 1
        assert len(result["learning_curves"][side][0]) == 2
        assert 0 < result[side]["generated_tokens_per_step"] <= 4 * 16 * 2
    assert (tmp_path / "out" / "result.json").is_file()
