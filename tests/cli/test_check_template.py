"""``rollforge check-template``: verdicts, the sample with its loss mask, one-line errors."""

from __future__ import annotations

import os

import pytest

from rollforge.cli.main import main

trl = pytest.importorskip("trl")
TEMPLATES = os.path.join(os.path.dirname(trl.__file__), "chat_templates")

# Written to microsoft/phi-4's documented chat template (no package ships it).
PHI4 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% elif message['role'] == 'user' %}{{ '<|im_start|>user<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|im_start|>assistant<|im_sep|>' + message['content'] + '<|im_end|>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}"
)


def test_a_template_file_is_checked_with_a_sample_showing_the_loss_mask(capsys):
    assert main(["check-template", os.path.join(TEMPLATES, "qwen3.jinja")]) == 0
    out = capsys.readouterr().out
    assert "family:         qwen3 (Qwen3), detected from the template" in out
    assert "tool calls:     parser 'hermes'" in out and "enable_thinking=True" in out
    assert "with tools:     tools via the template's tools=; segments:" in out
    assert "sample tool conversation: 3 turns, 1 segment(s)" in out
    assert "⟦<think>\nStep 1.\n</think>\n\n<tool_call>\n" in out and "lookup(2) = 14" in out  # results are context
    assert "sample (no tools) conversation: 2 turns, 2 segment(s)" in out  # a user turn drops past reasoning
    assert out.count("--- token-exact: yes") == 2


def test_llama_is_prefix_preserving_and_phi4_cannot_take_tools(tmp_path, capsys):
    assert main(["check-template", os.path.join(TEMPLATES, "llama3_1.jinja")]) == 0
    out = capsys.readouterr().out
    assert (
        "family:         llama3" in out and "with tools:     tools via the template's tools=; prefix-preserving" in out
    )
    template = tmp_path / "phi4.jinja"
    template.write_text(PHI4)
    assert main(["check-template", str(template)]) == 0
    out = capsys.readouterr().out
    assert "with tools:     UNUSABLE: the chat template of family 'phi4' drops tool messages" in out
    assert "sample (no tools) conversation: 2 turns, 1 segment(s)" in out


def test_a_model_directory_uses_its_own_tokenizer(tiny_model_dir, capsys):
    assert main(["check-template", str(tiny_model_dir), "--family", "chatml"]) == 0
    out = capsys.readouterr().out
    assert "(its own tokenizer and template)" in out and "family:         chatml" in out
    assert "tools described by the parser's fallback in the system message; prefix-preserving" in out


@pytest.mark.parametrize(
    "argument, message",
    [
        ("missing.jinja", "rollforge: error: template file 'missing.jinja' does not exist\n"),
        ("./no/such/model", "rollforge: error: model directory './no/such/model' does not exist\n"),
    ],
)
def test_a_bad_path_is_a_one_line_error(capsys, argument, message):
    assert main(["check-template", argument]) == 2
    assert capsys.readouterr().err == message


def test_an_unknown_family_is_a_one_line_error(capsys):
    assert main(["check-template", os.path.join(TEMPLATES, "qwen2_5.jinja"), "--family", "qwen9"]) == 2
    assert capsys.readouterr().err.startswith("rollforge: error: unknown model family 'qwen9'; valid names: chatml,")


def test_a_template_no_family_matches_says_chatml_is_a_fallback(capsys):
    from rollforge.chat.families import detect_family, matched_family

    cohere = open(os.path.join(TEMPLATES, "cohere.jinja"), encoding="utf-8").read()
    assert (matched_family(cohere), detect_family(cohere).name) == (None, "chatml")
    assert matched_family("<|im_start|>{{ message['content'] }}").name == "chatml"  # a ChatML template is a match
    assert main(["check-template", os.path.join(TEMPLATES, "cohere.jinja")]) == 0
    out = capsys.readouterr().out
    assert (
        "family:         chatml (ChatML: SmolLM2, SmolLM3, Hermes) "
        "(fallback: no known family matched the template; name one with --family)\n"
    ) in out
    assert main(["check-template", os.path.join(TEMPLATES, "cohere.jinja"), "--family", "qwen2_5"]) == 0
    assert "family:         qwen2_5 (Qwen2.5), named with --family\n" in capsys.readouterr().out
