"""Incremental rendering must reproduce the chat template exactly, or say why it cannot."""

from __future__ import annotations

import copy

import pytest
from transformers import AutoTokenizer

from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.errors import TemplateError
from rollforge.types import Failure, Message, Trajectory


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


def with_template(tokenizer, template: str):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_turn_pieces_of_the_chatml_template(renderer, tokenizer):
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert renderer.generation_prompt == encode(tokenizer, "<|im_start|>assistant\n")
    assert renderer.closing == [im_end] + encode(tokenizer, "\n")
    assert renderer.stop_token_ids == (im_end,)
    newline = encode(tokenizer, "\n")
    assert renderer.closing_ids([7, im_end]) == newline  # the model ended its turn itself
    assert renderer.closing_ids([7, 8]) == [im_end] + newline  # cut by a stop string or the budget
    assert renderer.content_ids([7, 8, im_end]) == [7, 8]


@pytest.mark.parametrize(
    "prompt",
    [
        [Message("user", "What is 2 + 2?")],
        [Message("system", "Be brief."), Message("user", "  leading spaces and\n\nnewlines\n")],
        [Message("system", "Be brief."), Message("user", "a"), Message("assistant", "b"), Message("user", "c")],
    ],
)
def test_prompt_ids_equal_the_whole_rendering(renderer, tokenizer, prompt):
    expected = encode(tokenizer, tokenizer.apply_chat_template([m.to_chat() for m in prompt], tokenize=False))
    assert renderer.prompt_ids(prompt) == expected
    assert renderer.prompt_ids(prompt) == expected  # second time through the cached shortcut


def test_prompt_shortcut_is_dropped_for_templates_that_rewrite_content(tokenizer):
    trimming = with_template(
        tokenizer,
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    renderer = ChatRenderer(trimming)
    for content in ("  padded  ", "plain"):
        prompt = [Message("system", "S"), Message("user", content)]
        expected = encode(tokenizer, trimming.apply_chat_template([m.to_chat() for m in prompt], tokenize=False))
        assert renderer.prompt_ids(prompt) == expected


def test_delta_ids_equal_the_tail_of_the_whole_rendering(renderer, tokenizer):
    conversation = [Message("user", "hi"), Message("assistant", "calling"), Message("tool", " 42\n", name="f")]
    whole = tokenizer.apply_chat_template([m.to_chat() for m in conversation], tokenize=False)
    head = tokenizer.apply_chat_template([m.to_chat() for m in conversation[:2]], tokenize=False)
    for _ in range(2):  # the second call uses the cached frame of tool messages
        assert renderer.delta_ids(conversation[2:]) == encode(tokenizer, whole[len(head) :])
    two = [Message("tool", "a", name="f"), Message("user", "b")]
    whole = tokenizer.apply_chat_template([m.to_chat() for m in conversation[:2] + two], tokenize=False)
    assert renderer.delta_ids(two) == encode(tokenizer, whole[len(head) :])


def test_a_template_that_rewrites_history_is_rendered_in_segments(tokenizer):
    # Like templates that drop earlier assistant turns' reasoning: only the last assistant message
    # keeps its content, so appending a turn changes the text before it.
    forgetful = with_template(
        tokenizer,
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}...{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    report = ChatRenderer(forgetful).check_template([Message("user", "hi")])
    assert not report.incremental and "not prefix-preserving: adding ['user'] messages" in report.reason
    assert "base gives 'im_start|>assistant\\nu<|im_end|>" in report.reason
    assert "base + new messages gives 'im_start|>assistant\\n...<|im_end|>" in report.reason
    assert ChatRenderer(tokenizer).check_template([Message("user", "hi")]).incremental  # ChatML is fine


def test_missing_template_is_a_clear_error(tokenizer):
    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatRenderer(bare)


class Describe:
    """A tool-call parser stand-in whose fallback description is fixed."""

    def __init__(self, text: str):
        self.text = text

    def system_prompt(self, tools) -> str:
        return self.text


def test_tools_go_to_the_template_or_to_a_fallback_system_prompt(renderer, tokenizer):
    tools = ({"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {}}}},)
    assert not renderer.supports_tools()  # ChatML without tool support, like SmolLM2's
    messages, template_tools = renderer.with_tool_prompt([Message("user", "go")], tools, Describe("TOOLS: move"))
    assert template_tools == () and messages == (Message("system", "TOOLS: move"), Message("user", "go"))
    merged, _ = renderer.with_tool_prompt(
        [Message("system", "Be nice."), Message("user", "go")], tools, Describe("TOOLS")
    )
    assert merged[0] == Message("system", "Be nice.\n\nTOOLS")

    aware = with_template(
        tokenizer,
        "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    aware_renderer = ChatRenderer(aware)
    assert aware_renderer.supports_tools()
    messages, template_tools = aware_renderer.with_tool_prompt([Message("user", "go")], tools, Describe("unused"))
    assert messages == (Message("user", "go"),) and template_tools == tools
    assert "move" in aware_renderer.render_text(messages, template_tools)


def test_fidelity_gap_finds_a_tampered_trajectory(renderer):
    prompt = (Message("user", "hi"),)
    generated = renderer.encode("hello") + list(renderer.stop_token_ids[:1])
    ids = renderer.prompt_ids(prompt) + renderer.generation_prompt + generated
    fields = dict(
        index=0, task_name="t", prompt_length=0, rewards=(0.0,), total_reward=0.0, turns=1, ending="terminated"
    )

    def trajectory(token_ids, content):
        n = len(token_ids) - len(generated)
        return Trajectory(
            messages=prompt + (Message("assistant", content),),
            token_ids=tuple(token_ids),
            loss_mask=(0,) * n + (1,) * len(generated),
            logprobs=(None,) * n + (-0.5,) * len(generated),
            **fields,
        )

    assert token_fidelity_gap(trajectory(ids, "hello"), renderer) is None
    assert token_fidelity_gap(trajectory(ids, "hullo"), renderer) is not None


def test_fidelity_gap_of_an_episode_that_failed_before_anything_was_rendered(renderer):
    # e.g. an agent whose first request the gateway refused: no messages, no ids, nothing to compare
    empty = Trajectory(
        index=0,
        task_name="t",
        messages=(),
        token_ids=(),
        loss_mask=(),
        logprobs=(),
        prompt_length=0,
        rewards=(),
        total_reward=0.0,
        turns=0,
        ending="error",
        error=Failure("env_error", "refused"),
    )
    assert token_fidelity_gap(empty, renderer) is None
