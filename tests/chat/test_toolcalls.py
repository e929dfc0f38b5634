"""Tool-call parsing per model family (rollforge.chat.toolcalls)."""

from __future__ import annotations

import json

import pytest

from rollforge.chat.toolcalls import (
    PARSER_NAMES,
    HermesParser,
    Llama3JsonParser,
    ToolCallParser,
    get_parser,
)
from rollforge.errors import ConfigError
from rollforge.types import ToolCall

MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the player.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": ["left", "right"]}, "steps": {"type": "integer"}},
            "required": ["direction"],
        },
    },
}
LOOK = {"name": "look", "description": "", "parameters": {"type": "object", "properties": {}, "required": []}}


@pytest.fixture
def hermes() -> HermesParser:
    return HermesParser()


def test_registry():
    assert PARSER_NAMES == ("deepseek", "gpt_oss", "harmony", "hermes", "llama3_json", "mistral", "qwen", "qwen3_coder")
    assert isinstance(get_parser(), HermesParser)
    assert isinstance(get_parser("qwen"), HermesParser)
    assert isinstance(get_parser("llama3_json"), Llama3JsonParser)
    assert isinstance(get_parser("hermes"), ToolCallParser)
    for name in PARSER_NAMES:
        assert isinstance(get_parser(name), ToolCallParser)
        assert get_parser(name).markers
    with pytest.raises(ConfigError, match=r"unknown tool-call parser 'mistal'; valid names: deepseek, gpt_oss, "):
        get_parser("mistal")


# --- hermes ---


def test_hermes_no_call(hermes):
    assert hermes.parse("The answer is 4.") == ()
    assert hermes.parse("") == ()


def test_hermes_single_call(hermes):
    text = 'Let me move.\n<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call>'
    assert hermes.parse(text) == (ToolCall(name="move", arguments={"direction": "left"}),)


def test_hermes_several_calls_in_order(hermes):
    text = (
        '<tool_call>\n{"name": "move", "arguments": {"direction": "left", "steps": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "look"}\n</tool_call>'
    )
    assert hermes.parse(text) == (
        ToolCall(name="move", arguments={"direction": "left", "steps": 2}),
        ToolCall(name="look", arguments={}),
    )


def test_hermes_arguments_as_json_string_and_null(hermes):
    text = (
        '<tool_call>{"name": "move", "arguments": "{\\"direction\\": \\"right\\"}"}</tool_call>'
        '<tool_call>{"name": "look", "arguments": null}</tool_call>'
        '<tool_call>{"name": "look", "arguments": ""}</tool_call>'
    )
    assert hermes.parse(text) == (
        ToolCall(name="move", arguments={"direction": "right"}),
        ToolCall(name="look", arguments={}),
        ToolCall(name="look", arguments={}),
    )


def test_hermes_keeps_an_id_when_given(hermes):
    text = '<tool_call>{"name": "look", "arguments": {}, "id": "call_1"}</tool_call>'
    assert hermes.parse(text) == (ToolCall(name="look", arguments={}, id="call_1"),)


def test_hermes_unterminated_final_call(hermes):
    text = 'ok <tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n'
    assert hermes.parse(text) == (ToolCall(name="move", arguments={"direction": "left"}),)
    # the end-of-turn token text a decoder may leave does not matter
    assert hermes.parse(text + "<|im_end|>") == (ToolCall(name="move", arguments={"direction": "left"}),)


def test_hermes_unterminated_broken_call_is_an_error(hermes):
    (call,) = hermes.parse('<tool_call>{"name": "move", "arguments": {"dir')
    assert call == ToolCall(
        name="move",  # read from the broken JSON, so that the error names the tool
        arguments={},
        # char 31 is the quote opening "dir, counted from the "{" after the tag
        error="invalid JSON in unterminated <tool_call>: Unterminated string starting at char 31",
    )
    (call,) = hermes.parse('<tool_call>{"name": "look"} and then I think')
    assert call.error == "unterminated <tool_call>: text follows the JSON object; close it with </tool_call>"


def test_hermes_invalid_json(hermes):
    text = '<tool_call>\n{"name": "move" "arguments": {}}\n</tool_call>'
    assert hermes.parse(text) == (
        ToolCall(name="move", arguments={}, error="invalid JSON in <tool_call>: Expecting ',' delimiter at char 17"),
    )


@pytest.mark.parametrize(
    "payload, name, error",
    [
        ('{"arguments": {}}', "", 'tool call is missing "name"'),
        ('{"name": 3}', "", 'tool call "name" must be a non-empty string, got 3'),
        ('{"name": ""}', "", 'tool call "name" must be a non-empty string, got ""'),
        ("[1, 2]", "", 'a tool call must be a JSON object with "name" and "arguments", got array'),
        (
            '{"name": "move", "arguments": [1]}',
            "move",
            '"arguments" of tool call move must be a JSON object, got array',
        ),
        (
            '{"name": "move", "arguments": "{left"}',
            "move",
            '"arguments" of tool call move is a string but not valid JSON: '
            "Expecting property name enclosed in double quotes at char 1",
        ),
    ],
)
def test_hermes_malformed_calls(hermes, payload, name, error):
    assert hermes.parse(f"<tool_call>{payload}</tool_call>") == (ToolCall(name=name, arguments={}, error=error),)


def test_hermes_good_call_survives_a_bad_sibling(hermes):
    text = '<tool_call>{oops}</tool_call><tool_call>{"name": "look", "arguments": {}}</tool_call>'
    bad, good = hermes.parse(text)
    assert bad.error is not None and bad.error.startswith("invalid JSON in <tool_call>: ")
    assert good == ToolCall(name="look", arguments={})


def test_hermes_system_prompt(hermes):
    assert hermes.system_prompt([MOVE, LOOK]) == (
        "You can call the following tools:\n"
        "- move: Move the player.\n"
        '  parameters: {"type": "object", "properties": {"direction": {"type": "string", "enum": ["left", "right"]}, '
        '"steps": {"type": "integer"}}, "required": ["direction"]}\n'
        "- look: (no description)\n"
        '  parameters: {"type": "object", "properties": {}, "required": []}\n'
        "\n"
        'To call a tool, write a JSON object with its "name" and its "arguments" between <tool_call> and '
        "</tool_call> tags, exactly like this:\n"
        "<tool_call>\n"
        '{"name": "move", "arguments": {"direction": "left"}}\n'
        "</tool_call>\n"
        "You may call several tools in one message, one tag pair per call. Each result comes back to you in a "
        "tool message. When you are done, answer without a tool call."
    )
    assert hermes.system_prompt([]) == ""


def test_hermes_system_prompt_example_parses_back(hermes):
    prompt = hermes.system_prompt([MOVE])
    example = prompt[prompt.index("<tool_call>\n") : prompt.index("</tool_call>\n") + len("</tool_call>")]
    assert hermes.parse(example) == (ToolCall(name="move", arguments={"direction": "left"}),)


def test_system_prompt_rejects_a_tool_without_a_name(hermes):
    with pytest.raises(ConfigError, match="a tool schema needs a function name"):
        hermes.system_prompt([{"type": "function", "function": {"description": "x"}}])


# --- llama3_json ---


def test_llama3_json_whole_message_call():
    parser = Llama3JsonParser()
    assert parser.parse('{"name": "move", "parameters": {"direction": "right"}}') == (
        ToolCall(name="move", arguments={"direction": "right"}),
    )
    assert parser.parse('<|python_tag|>{"name": "look", "arguments": {}}<|eot_id|>') == (
        ToolCall(name="look", arguments={}),
    )


def test_llama3_json_plain_answers_are_not_calls():
    parser = Llama3JsonParser()
    assert parser.parse("The answer is 4.") == ()
    assert parser.parse('{"answer": 4}') == ()
    assert parser.parse('{"name": "move", "parameters": {}} is what I would call') == ()


def test_llama3_json_errors():
    parser = Llama3JsonParser()
    assert parser.parse('{"name": "move", "parameters": {') == (
        ToolCall(
            name="move",
            arguments={},
            error="invalid JSON in tool call: Expecting property name enclosed in double quotes at char 32",
        ),
    )
    assert parser.parse('{"parameters": {"direction": "left"}}') == (
        ToolCall(name="", arguments={}, error='tool call is missing "name"'),
    )


def test_llama3_json_system_prompt_example_parses_back():
    parser = Llama3JsonParser()
    prompt = parser.system_prompt([MOVE])
    assert prompt.endswith(
        "Call one tool per message. Each result comes back to you in a tool message. "
        "When you are done, answer without a tool call."
    )
    example = next(line for line in prompt.splitlines() if line.startswith('{"name"'))
    assert json.loads(example) == {"name": "move", "parameters": {"direction": "left"}}
    assert parser.parse(example) == (ToolCall(name="move", arguments={"direction": "left"}),)
