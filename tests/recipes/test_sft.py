"""Supervised fine-tuning: the masked NLL by hand, token-exact examples, rejection sampling, and
the tiny model learning valid tool calls from expert demonstrations."""

from __future__ import annotations

import json

import pytest
import torch

from rollforge.backends.hf import HFBackend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import get_parser
from rollforge.envs.experts import format_tool_call
from rollforge.envs.library import get_env_spec
from rollforge.envs.library.words import WORDS
from rollforge.errors import ConfigError
from rollforge.models import load_model, load_tokenizer
from rollforge.recipes.sft import MaskedNLLLoss, sft, sft_update
from rollforge.recipes.sft_config import load_sft_config
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import rollout
from rollforge.types import Message, Sample
from rollforge.recipes.sft_data import (
    Example,
    accepted,
    conversation_example,
    read_records,
    record_examples,
    select_trajectories,
)

# -- the loss --------------------------------------------------------------------------------------


def test_masked_nll_by_hand():
    # Two rows; mask-1 tokens: row 0 positions 1 and 2, row 1 position 3 -> N = 3 tokens.
    masks = [torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 0.0, 1.0])]
    weights = MaskedNLLLoss.weights(masks)
    assert torch.allclose(weights[0], torch.tensor([0, 1 / 3, 1 / 3, 0])) and float(weights[1][3]) == pytest.approx(
        1 / 3
    )
    logprobs = torch.tensor([[-9.0, -0.5, -1.0, -7.0], [-5.0, -6.0, -8.0, -1.5]])
    # Mask-0 logprobs (-9, -7, -5, -6, -8) must not count:
    # loss = -(-0.5 - 1.0 - 1.5) / 3 = 3.0 / 3 = 1.0
    loss = MaskedNLLLoss()(logprobs, torch.stack(weights))
    assert float(loss) == pytest.approx(1.0)
    # Accumulated over two micro-batches (one row each) it is the same number: 0.5 + 0.5.
    parts = [MaskedNLLLoss()(logprobs[i : i + 1], weights[i][None]) for i in range(2)]
    assert [float(p) for p in parts] == pytest.approx([0.5, 0.5])


def test_masked_nll_refuses_a_batch_without_loss_tokens():
    with pytest.raises(ConfigError, match="no tokens with loss mask 1"):
        MaskedNLLLoss.weights([torch.zeros(4)])


def _reference_nll(model, examples):
    """Mean NLL over mask-1 tokens from plain full forward passes, one example at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for e in examples:
            ids = torch.tensor([e.ids])
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]  # (T, V)
            for t in range(1, len(e.ids)):
                if e.mask[t]:
                    total -= float(logp[t - 1, e.ids[t]])
                    count += 1
    return total / count


@pytest.mark.parametrize("micro_batch_tokens", [8, 4096])
def test_sft_update_loss_is_the_mean_nll_of_mask_one_tokens(tiny_model_dir, micro_batch_tokens):
    model, tokenizer = load_model(str(tiny_model_dir))
    examples = [
        Example((5, 9, 17, 30, 31, 2), (0, 0, 1, 1, 0, 1), 2),
        Example((5, 9, 40, 41), (0, 0, 1, 1), 2),
        Example((7, 8, 9, 10, 11), (0, 1, 0, 0, 1), 1),
    ]
    expected = _reference_nll(model, examples)
    flipped = [
        Example(e.ids, tuple(1 - b if i else 0 for i, b in enumerate(e.mask)), e.prompt_length) for e in examples
    ]
    assert _reference_nll(model, flipped) != pytest.approx(expected)  # the mask decides what counts
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = sft_update(model, optimizer, examples, micro_batch_tokens=micro_batch_tokens, pad_id=0)
    assert stats.loss == pytest.approx(expected, rel=1e-5)
    assert stats.loss_tokens == 7 and stats.tokens == 15  # 3 + 2 + 2 mask-1 tokens; 6 + 4 + 5 tokens
    assert stats.micro_batches == (3 if micro_batch_tokens == 8 else 1)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_micro_batching_gives_the_full_batch_gradient(tiny_model_dir):
    grads = []
    for budget in (6, 4096):
        model, _ = load_model(str(tiny_model_dir))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        examples = [Example((5, 9, 17, 30, 31, 2), (0, 0, 1, 1, 0, 1)), Example((3, 4, 40), (0, 1, 1))]
        captured = {}
        hook = optimizer.step
        optimizer.step = lambda: captured.update({n: p.grad.clone() for n, p in model.named_parameters()}) or hook()
        sft_update(model, optimizer, examples, micro_batch_tokens=budget, pad_id=0)
        grads.append(captured)
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-6), name


# -- examples ----------------------------------------------------------------------------------------


def test_conversation_example_is_token_exact_and_masks_only_assistant_turns(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    renderer = ChatRenderer(tokenizer)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And three times five?"},
        {"role": "assistant", "content": "Fifteen."},
    ]
    example = conversation_example(renderer, messages)
    # The ids decode to the template's rendering (minus the trailing newline after the last <|im_end|>,
    # which a rollout also ends without).
    rendered = renderer.render_text([Message(**m) for m in messages])
    assert renderer.decode(example.ids) + "\n" == rendered
    policy = [i for i, b in zip(example.ids, example.mask) if b]
    assert renderer.decode(policy) == "Four.<|im_end|>Fifteen.<|im_end|>"
    assert example.ids[: example.prompt_length] == tuple(renderer.prompt_ids([Message(**m) for m in messages[:2]]))
    with pytest.raises(ConfigError, match="no assistant message"):
        conversation_example(renderer, messages[:2])


def test_openai_style_tool_calls_are_written_in_the_parser_format(tiny_model_dir):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    messages = [
        {"role": "user", "content": "Move left."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "move", "arguments": '{"direction": "left"}'}}
            ],
        },
        {"role": "tool", "content": "moved", "name": "move", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Done."},
    ]
    example = conversation_example(renderer, messages)
    policy = renderer.decode([i for i, b in zip(example.ids, example.mask) if b])
    assert (
        policy
        == '<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call><|im_end|>Done.<|im_end|>'
    )
    broken = [messages[0], {**messages[1], "tool_calls": [{"function": {"name": "move", "arguments": "{left"}}]}]
    with pytest.raises(ConfigError, match="not valid JSON"):
        conversation_example(renderer, broken)


def _records(tmp_path):
    rows = [
        {"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "total_reward": 1.0, "error": None},
        {"token_ids": [1, 2, 4], "loss_mask": [0, 1, 1], "total_reward": 0.5, "error": None},
        {"token_ids": [1, 2, 5], "loss_mask": [0, 1, 1], "total_reward": 0.0, "reward": 0.9, "error": None},
        {
            "token_ids": [1, 2, 6],
            "loss_mask": [0, 1, 1],
            "total_reward": 1.0,
            "error": {"kind": "env_error", "message": "x"},
        },
    ]
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"token_ids": [1, 2')  # a torn last line
    return path


def test_trajectory_records_are_filtered_by_reward_and_error(tmp_path):
    records = read_records(_records(tmp_path))
    assert len(records) == 4  # the torn line is skipped
    assert [e.ids[-1] for e in record_examples(records, 0.9)] == [3, 5]  # 'reward' (with reward functions) wins
    assert [e.ids[-1] for e in record_examples(records, None)] == [3, 4, 5]  # failed episodes never
    assert [e.ids[-1] for e in record_examples(read_records(tmp_path / "traj*.jsonl"), 1.0)] == [3]
    with pytest.raises(ConfigError, match="not found"):
        read_records(tmp_path / "missing.jsonl")


def test_rejection_sampling_keeps_exactly_the_episodes_at_or_above_the_threshold(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    renderer = ChatRenderer(tokenizer)
    spec = get_env_spec("echo")
    words = list(WORDS[10:22])
    samples = [
        Sample((Message("user", f'Call the echo tool with the text "{w}".'),), "echo", {"word": w}) for w in words
    ]
    right = {0, 2, 5, 6, 8, 9}  # these episodes echo their word (reward 1.0), the others a wrong one (0.0)
    broken = 3  # this one's backend request fails (an error: never kept, whatever its reward)
    parser = get_parser()

    def script(request):
        prompt = renderer.decode(request.prompt_ids)
        index = next(i for i, w in enumerate(words) if f'"{w}"' in prompt)
        if index == broken:
            raise RuntimeError("backend down")
        return format_tool_call(parser, "echo", {"text": words[index] if index in right else "wrong"})

    result = rollout(
        samples, {"echo": spec.build()}, ScriptedBackend(script, tokenizer), renderer, RolloutConfig(max_turns=2)
    )
    rewards = [t.total_reward for t in result.trajectories]
    assert rewards == [1.0 if i in right else 0.0 for i in range(12)]
    assert result.trajectories[broken].error.kind == "backend_error"
    assert [t.index for t in select_trajectories(result.trajectories, 1.0)] == [0, 2, 5, 6, 8, 9]
    assert [t.index for t in select_trajectories(result.trajectories, 0.0)] == [i for i in range(12) if i != broken]
    scores = [i / 10 for i in range(12)]  # e.g. with reward functions added
    assert [t.index for t in select_trajectories(result.trajectories, 0.5, rewards=scores)] == [5, 6, 7, 8, 9, 10, 11]
    assert accepted(1.0, False, None) and not accepted(1.0, True, None) and not accepted(None, False, 0.0)


# -- end to end --------------------------------------------------------------------------------------


def _valid_tool_call_fraction(model_dir, env: str, episodes: int):
    model, tokenizer = load_model(str(model_dir))
    spec = get_env_spec(env)
    result = rollout(
        spec.samples(episodes, 99),
        {spec.name: spec.build()},
        HFBackend(model, tokenizer),
        ChatRenderer(tokenizer),
        RolloutConfig(max_turns=2, max_new_tokens=48, greedy=True),
    )
    replies = [m for t in result.trajectories for m in t.messages if m.role == "assistant"]
    valid = [m for m in replies if m.tool_calls and all(c.error is None and c.name == "echo" for c in m.tool_calls)]
    return len(valid) / len(replies), len(replies)


def test_sft_on_expert_demonstrations_teaches_the_tiny_model_valid_tool_calls(tiny_model_dir, tmp_path):
    before, _ = _valid_tool_call_fraction(tiny_model_dir, "echo", 16)
    assert before == 0.0
    config = load_sft_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'sft'}",
            "sources=[{kind: expert, env: echo, episodes: 32}]",
            "batch_size=8",
            "epochs=6",
            "optim.lr=1e-2",
            "rollout.max_seq_len=1024",
        ]
    )
    result = sft(config, console=False)
    assert result.steps == 24  # 32 demonstrations / 8 per step x 6 epochs
    losses = [m["loss"] for m in result.history]
    assert losses[0] > 5 and losses[-1] < 0.5
    model_dir = result.out / "checkpoints" / "step-000024" / "model"
    after, replies = _valid_tool_call_fraction(model_dir, "echo", 16)
    assert replies == 16 and after >= 0.9, after


def test_sft_from_rollouts_trains_on_the_kept_episodes(tiny_model_dir, tmp_path):
    config = load_sft_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'rs'}",
            "from_rollouts.enabled=true",
            "from_rollouts.environments=[{name: guess_number}]",
            "from_rollouts.prompts=3",
            "from_rollouts.samples_per_prompt=2",
            "from_rollouts.min_reward=0.0",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=4",
            "batch_size=4",
        ]
    )
    result = sft(config, console=False)
    first = result.history[0]
    # reward 0.0 >= 0.0: every episode that did not fail is kept (6 of 6), in 2 steps of <= 4
    assert first["rollout/episodes"] == 6 and first["rollout/kept"] == 6 and result.steps == 2
    lines = (result.out / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    assert len(lines) == 6


def test_sft_config_errors_name_the_bad_key():
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        load_sft_config(overrides=["batch_sise=4"])
    with pytest.raises(ConfigError, match=r"sources\[0\]: kind 'expertt' is not one of"):
        load_sft_config(overrides=["sources=[{kind: expertt, env: echo}]"])
    with pytest.raises(ConfigError, match=r"did you mean 'sources\[0\].episodes'"):
        load_sft_config(overrides=["sources=[{kind: expert, env: echo, episode: 3}]"])


def test_sft_with_lora_saves_an_adapter(tiny_model_dir, tmp_path):
    pytest.importorskip("peft")
    config = load_sft_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'lora'}",
            "sources=[{kind: expert, env: echo, episodes: 4}]",
            "batch_size=4",
            "lora.enabled=true",
            "lora.r=4",
            "optim.lr=1e-3",
            "rollout.max_seq_len=1024",
        ]
    )
    result = sft(config, console=False)
    assert result.steps == 1 and result.history[0]["loss_tokens"] > 0
    model_dir = result.out / "checkpoints" / "step-000001" / "model"
    assert (model_dir / "adapter_model.safetensors").is_file()


def test_sft_command_runs_a_config_file(tiny_model_dir, tmp_path, capsys):
    from rollforge.cli.main import main

    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {{name: {tiny_model_dir}}}\nout: {tmp_path / 'cli'}\nbatch_size: 4\n"
        "sources:\n  - {kind: expert, env: echo, episodes: 4}\n"
        "from_rollouts: {environments: [{name: guess_number}], prompts: 2, samples_per_prompt: 2, min_reward: 0.0}\n"
        "rollout: {max_turns: 2, max_new_tokens: 64, max_seq_len: 1024}\n"
    )
    assert main(["sft", str(config), "--from-rollouts"]) == 0
    assert "fine-tuned 2 steps" in capsys.readouterr().out  # 4 demonstrations, then 4 kept rollouts
    assert main(["sft", "--help-config"]) == 0
    assert "from_rollouts.min_reward = 1.0" in capsys.readouterr().out
    assert main(["sft", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_demonstrations_that_miss_the_threshold_are_a_clear_error(tiny_model_dir, tmp_path):
    config = load_sft_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'x'}",
            "sources=[{kind: expert, env: guess_number, episodes: 4}]",
            "rollout.max_turns=1",
        ]
    )
    with pytest.raises(
        ConfigError, match=r"none of the 4 guess_number demonstrations reached min_reward 1.0 .*max_turns"
    ):
        sft(config, console=False)


def test_the_sft_example_config_loads():
    from pathlib import Path

    from rollforge.recipes.sft_config import load_sft_config

    config = load_sft_config(Path(__file__).parents[2] / "examples" / "sft_expert.yaml")
    assert [s.kind for s in config.sources] == ["expert", "expert"] and config.from_rollouts.rounds == 1


def test_an_sft_config_that_is_not_yaml_is_one_line(tmp_path, capsys):
    from rollforge.cli.main import main

    config = tmp_path / "bad.yaml"
    config.write_text("sources: [\n  - {kind: expert\n")
    assert main(["sft", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not valid YAML" in err and "line" in err


@pytest.mark.parametrize("shuffle", [False, True])
def test_unshuffled_epochs_keep_a_balanced_sources_blocks_in_every_batch(
    tiny_model_dir, tmp_path, monkeypatch, shuffle
):
    """``shuffle: false`` reads the demonstrations in order: calculator's balanced blocks of 4 (each
    (question kind, tool) pair once) are then the batches, so no step leans toward one tool."""
    import re

    from rollforge.recipes import sft as sft_module

    tokenizer = load_tokenizer(tiny_model_dir)
    batches: list[list[tuple[str, str]]] = []
    kinds: list[tuple[str, str]] = []

    def recording(model, optimizer, batch, **kwargs):
        for example in batch:
            text = tokenizer.decode(example.ids)
            question = re.search(r"\d+ (plus|times) \d+", text)  # the tool called after it
            kinds.append((question.group(1), re.search(r'"name": "(add|multiply)"', text[question.end() :]).group(1)))
        batches.append(kinds[-len(batch) :])
        return sft_update(model, optimizer, batch, **kwargs)

    monkeypatch.setattr(sft_module, "sft_update", recording)
    config = load_sft_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'sft'}",
            "batch_size=4",
            "epochs=2",
            f"shuffle={str(shuffle).lower()}",
            "sources=[{kind: expert, env: calculator, episodes: 16, min_reward: null, options: {operations: [plus, times], balanced: true}}]",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=48",
            "rollout.max_seq_len=1024",
        ]
    )
    sft(config, console=False)
    every_pair = sorted((op, tool) for op in ("plus", "times") for tool in ("add", "multiply"))
    assert len(batches) == 8
    assert all(sorted(batch) == every_pair for batch in batches) is not shuffle
