"""Qwen3-Coder XML tool calls (rollforge.chat.toolcalls.qwen3_coder), checked against the text
that Qwen3.5's chat template (TRL's wheel, same XML format) renders for assistant tool calls."""

from __future__ import annotations

import pytest

from rollforge.chat.toolcalls import Qwen3CoderParser, get_parser
from rollforge.types import ToolCall

MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the player.",
        "parameters": {
            "type": "object",
            "properties": {
                "direction": {"type": "string", "enum": ["left", "right"]},
                "steps": {"type": "integer"},
                "note": {"type": "string"},
                "fast": {"type": "boolean"},
            },
            "required": ["direction"],
        },
    },
}


@pytest.fixture
def parser() -> Qwen3CoderParser:
    return get_parser("qwen3_coder")


def test_one_call_with_typed_values(parser):
    text = (
        "I will move.\n<tool_call>\n<function=move>\n<parameter=direction>\nleft\n</parameter>\n"
        '<parameter=steps>\n2\n</parameter>\n<parameter=path>\n[1, {"a": null}]\n</parameter>\n'
        "<parameter=text>\nline one\nline two\n</parameter>\n</function>\n</tool_call><|im_end|>"
    )
    assert parser.parse(text) == (
        ToolCall("move", {"direction": "left", "steps": 2, "path": [1, {"a": None}], "text": "line one\nline two"}),
    )


def test_several_calls_and_functions_without_wrapper(parser):
    text = (
        "<tool_call>\n<function=look>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=move>\n<parameter=direction>\nright\n</parameter>\n</function>\n</tool_call>"
    )
    assert parser.parse(text) == (ToolCall("look", {}), ToolCall("move", {"direction": "right"}))
    assert parser.parse("<function=look>\n</function>") == (ToolCall("look", {}),)
    assert parser.parse("no call here") == ()


def test_missing_closing_tags_and_a_cut_generation_keep_the_call(parser):
    # as in Qwen's parser, a value also ends at the next <parameter= or at </function>
    text = "<tool_call>\n<function=move>\n<parameter=direction>\nleft\n<parameter=steps>\n3\n</function>\n</tool_call>"
    assert parser.parse(text) == (ToolCall("move", {"direction": "left", "steps": 3}),)
    cut = "<tool_call>\n<function=move>\n<parameter=direction>\nleft\n</param"
    assert parser.parse(cut) == (ToolCall("move", {"direction": "left"}),)


def test_values_by_schema_when_the_parser_knows_the_tools():
    text = (
        "<tool_call>\n<function=move>\n<parameter=direction>\nleft\n</parameter>\n<parameter=steps>\n2\n</parameter>\n"
        "<parameter=note>\n42\n</parameter>\n<parameter=fast>\nTrue\n</parameter>\n</function>\n</tool_call>"
    )
    # without the schema "42" reads as a number; with it, a string parameter keeps its text
    assert get_parser("qwen3_coder").parse(text)[0].arguments == {
        "direction": "left",
        "steps": 2,
        "note": 42,
        "fast": "True",
    }
    assert Qwen3CoderParser([MOVE]).parse(text)[0].arguments == {
        "direction": "left",
        "steps": 2,
        "note": "42",
        "fast": True,
    }


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<tool_call>\nmove\n</tool_call>", ToolCall("", {}, error="<tool_call> holds no <function=NAME> element")),
        ("<tool_call>\n<function=move", ToolCall("", {}, error="unterminated <function=NAME> tag")),
        (
            "<tool_call><function=go left>\n</function></tool_call>",
            ToolCall(
                "",
                {},
                error='the function name in <function=NAME> must be one word without spaces or markup, got "go left"',
            ),
        ),
        (
            "<tool_call><function=move><parameter=a>\n1\n</parameter><parameter=a>\n2\n</parameter></function></tool_call>",
            ToolCall("move", {}, error='tool call move: parameter "a" is given twice'),
        ),
        (
            "<tool_call><function=move><parameter=a",
            ToolCall("move", {}, error="tool call move: unterminated <parameter=NAME> tag"),
        ),
    ],
)
def test_malformed_calls_are_error_calls(parser, text, expected):
    assert parser.parse(text) == (expected,)


def test_unreadable_numbers_stay_text_for_validation_to_reject(parser):
    text = "<function=f><parameter=a>\nNaN\n</parameter><parameter=b>\n1e999\n</parameter><parameter=c>\n" + "9" * 5000
    (call,) = parser.parse(text + "\n</parameter></function>")
    assert call == ToolCall("f", {"a": "NaN", "b": "1e999", "c": "9" * 5000})


def test_parses_what_the_qwen3_5_template_renders(parser, trl_template, rendered_reply):
    calls = [
        {
            "type": "function",
            "function": {"name": "move", "arguments": {"direction": "left", "steps": 2, "tags": ["a", "b"]}},
        },
        {"type": "function", "function": {"name": "look", "arguments": {}}},
    ]
    reply = rendered_reply(trl_template("qwen3_5_nothink"), {"role": "assistant", "content": "", "tool_calls": calls})
    assert "<tool_call>\n<function=move>\n<parameter=direction>\nleft\n</parameter>" in reply
    assert parser.parse(reply) == (
        ToolCall("move", {"direction": "left", "steps": 2, "tags": ["a", "b"]}),
        ToolCall("look", {}),
    )


def test_system_prompt_example_parses_back(parser):
    prompt = parser.system_prompt([MOVE])
    assert "<name>move</name>" in prompt and '<required>["direction"]</required>' in prompt
    start = prompt.index("<tool_call>\n<function=move>")
    example = prompt[start : prompt.index("</tool_call>", start) + len("</tool_call>")]
    assert parser.parse(example) == (ToolCall("move", {"direction": "left"}),)
    assert parser.system_prompt([]) == ""
