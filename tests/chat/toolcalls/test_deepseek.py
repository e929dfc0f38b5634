"""DeepSeek tool-call tokens (rollforge.chat.toolcalls.deepseek), checked against the text that
DeepSeek-V3's chat template (TRL's wheel) renders for assistant tool calls."""

from __future__ import annotations

import pytest

from rollforge.chat.toolcalls import DeepSeekParser, get_parser
from rollforge.types import ToolCall

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the player.",
        "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}, "required": ["direction"]},
    },
}


@pytest.fixture
def parser() -> DeepSeekParser:
    return get_parser("deepseek")


def test_v3_form_with_fenced_json(parser):
    text = (
        f'Let me look.{BEGIN}{CALL}function{SEP}move\n```json\n{{"direction": "left"}}\n```{CALL_END}\n'
        f"{CALL}function{SEP}look\n```json\n{{}}\n```{CALL_END}{END}<｜end▁of▁sentence｜>"
    )
    assert parser.parse(text) == (ToolCall("move", {"direction": "left"}), ToolCall("look", {}))


def test_v3_1_form(parser):
    text = f'{BEGIN}{CALL}move{SEP}{{"direction": "right"}}{CALL_END}{CALL}look{SEP}{{}}{CALL_END}{END}'
    assert parser.parse(text) == (ToolCall("move", {"direction": "right"}), ToolCall("look", {}))


def test_cut_generations_keep_the_name(parser):
    assert parser.parse(f'{BEGIN}{CALL}function{SEP}move\n```json\n{{"direction": "left"}}\n``') == (
        ToolCall("move", {"direction": "left"}),
    )
    assert parser.parse(f'{BEGIN}{CALL}move{SEP}{{"direction": "left"}}<｜tool▁call') == (
        ToolCall("move", {"direction": "left"}),
    )
    (call,) = parser.parse(f'{BEGIN}{CALL}move{SEP}{{"direction": ')
    assert (
        call.name == "move"
        and call.error == "invalid JSON in the arguments of tool call move: Expecting value at char 14"
    )


def test_plain_answers_are_not_calls(parser):
    assert parser.parse("<think>hmm</think>The answer is 4.") == ()


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"{BEGIN}oops{END}", ToolCall("", {}, error=f"{BEGIN} is not followed by {CALL}")),
        (f"{BEGIN}{CALL}move{CALL_END}", ToolCall("", {}, error=f"{CALL} is not followed by NAME{SEP}ARGUMENTS")),
        (
            f"{BEGIN}{CALL}move{SEP}[1]{CALL_END}",
            ToolCall("move", {}, error='"arguments" of tool call move must be a JSON object, got array'),
        ),
        (
            f"{BEGIN}{CALL}move{SEP}{{}} and more{CALL_END}",
            ToolCall("move", {}, error=f"tool call move: text follows its JSON arguments before {CALL_END}"),
        ),
        (
            f'{BEGIN}{CALL}move{SEP}{{"n": Infinity}}{CALL_END}',
            ToolCall(
                "move", {}, error="invalid JSON in the arguments of tool call move: Infinity is not a JSON number"
            ),
        ),
    ],
)
def test_malformed_calls_are_error_calls(parser, text, expected):
    assert parser.parse(text) == (expected,)


def test_parses_what_the_deepseek_v3_template_renders(parser, trl_template, rendered_reply):
    calls = [
        {"type": "function", "function": {"name": "move", "arguments": '{"direction": "left", "steps": 2}'}},
        {"type": "function", "function": {"name": "look", "arguments": "{}"}},
    ]
    reply = rendered_reply(trl_template("deepseekv3"), {"role": "assistant", "content": None, "tool_calls": calls})
    assert reply.startswith(f"<｜Assistant｜>{BEGIN}{CALL}function{SEP}move\n```json\n")
    assert parser.parse(reply) == (ToolCall("move", {"direction": "left", "steps": 2}), ToolCall("look", {}))


def test_system_prompt_example_parses_back(parser):
    prompt = parser.system_prompt([MOVE])
    example = next(line for line in prompt.splitlines() if line.startswith(BEGIN))
    example = prompt[prompt.index(example) : prompt.index(END) + len(END)]
    assert parser.parse(example) == (ToolCall("move", {"direction": "..."}),)
