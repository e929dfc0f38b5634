"""Mistral ``[TOOL_CALLS]`` parsing (rollforge.chat.toolcalls.mistral), checked against the text
that ``mistral-common``'s own instruct tokenizers encode for assistant tool calls."""

from __future__ import annotations

import base64
import json

import pytest

from rollforge.chat.toolcalls import MistralParser, get_parser
from rollforge.types import ToolCall

MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the player.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": ["left", "right"]}},
            "required": ["direction"],
        },
    },
}


@pytest.fixture
def parser() -> MistralParser:
    return get_parser("mistral")


def test_v3_json_list_keeps_ids_in_order(parser):
    text = (
        '[TOOL_CALLS] [{"name": "move", "arguments": {"direction": "left"}, "id": "a1b2c3d4e"}, '
        '{"name": "look", "arguments": {}, "id": "Zz9Yy8Xx7"}]</s>'
    )
    assert parser.parse(text) == (
        ToolCall(name="move", arguments={"direction": "left"}, id="a1b2c3d4e"),
        ToolCall(name="look", arguments={}, id="Zz9Yy8Xx7"),
    )


def test_v3_single_object_and_no_id(parser):
    assert parser.parse('[TOOL_CALLS]{"name": "look", "arguments": {}}') == (ToolCall(name="look", arguments={}),)


def test_v11_named_form_with_and_without_call_ids(parser):
    text = '[TOOL_CALLS]move[ARGS]{"direction": "right"}[TOOL_CALLS]look[CALL_ID]abcdEFGH1[ARGS]{}</s>'
    assert parser.parse(text) == (
        ToolCall(name="move", arguments={"direction": "right"}),
        ToolCall(name="look", arguments={}, id="abcdEFGH1"),
    )


def test_plain_answers_are_not_calls(parser):
    assert parser.parse("The answer is 4.</s>") == ()
    assert parser.markers == ("[TOOL_CALLS]",)


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            '[TOOL_CALLS] [{"name": "move", "arguments": {"direction": "left"}, "id": "short"}]',
            ToolCall("move", {}, error='tool call move: id "short" must be 9 letters and digits'),
        ),
        (
            "[TOOL_CALLS]move",
            ToolCall("move", {}, error="tool call move: expected [ARGS] and a JSON object after the name"),
        ),
        (
            '[TOOL_CALLS]move[ARGS]{"direction": ',
            ToolCall("move", {}, error="invalid JSON in the arguments of tool call move: Expecting value at char 14"),
        ),
        (
            "[TOOL_CALLS]move[ARGS][1]",
            ToolCall("move", {}, error='"[ARGS]" of tool call move must be a JSON object, got array'),
        ),
        (
            "[TOOL_CALLS]two words[ARGS]{}",
            ToolCall(
                "",
                {},
                error='the tool name after [TOOL_CALLS] must be one word without spaces or markup, got "two words"',
            ),
        ),
        ("[TOOL_CALLS] []", ToolCall("", {}, error="[TOOL_CALLS] is followed by an empty list")),
        (
            '[TOOL_CALLS] [{"name": "move", "arguments": {"n": NaN}}]',
            ToolCall("move", {}, error="invalid JSON after [TOOL_CALLS]: NaN is not a JSON number"),
        ),
    ],
)
def test_malformed_calls_are_error_calls(parser, text, expected):
    assert parser.parse(text) == (expected,)


def test_system_prompt_example_parses_back(parser):
    prompt = parser.system_prompt([MOVE])
    example = next(line for line in prompt.splitlines() if line.startswith("[TOOL_CALLS] "))
    assert parser.parse(example) == (ToolCall(name="move", arguments={"direction": "left"}, id="a1b2c3d4e"),)
    assert json.loads(prompt.splitlines()[1]) == [MOVE]
    assert parser.system_prompt([]) == ""


# --- against mistral-common: the text its instruct tokenizers write for assistant tool calls ---


def _instruct_tokenizer(version: str):
    """mistral-common's instruct tokenizer of ``version`` over a byte-level Tekken vocabulary (256
    byte tokens: tiny and offline; the tool-call encoding does not depend on the merges)."""
    pytest.importorskip("mistral_common")
    from mistral_common.tokens.tokenizers.base import TokenizerVersion
    from mistral_common.tokens.tokenizers.instruct import InstructTokenizerV3, InstructTokenizerV11
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    special = [dict(t) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS]
    special += [
        {"rank": 20, "token_str": "[ARGS]", "is_control": True},
        {"rank": 21, "token_str": "[CALL_ID]", "is_control": True},
    ]
    vocab = [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None} for i in range(256)]
    tokenizer = Tekkenizer(
        vocab,
        special,
        pattern=r"\s+|\S+",
        vocab_size=256 + 100,
        num_special_tokens=100,
        version=TokenizerVersion(version),
    )
    return (InstructTokenizerV11 if version == "v11" else InstructTokenizerV3)(tokenizer)


def _encoded_text(version: str, calls: list[tuple[str, dict, str | None]]) -> str:
    from mistral_common.protocol.instruct.messages import AssistantMessage
    from mistral_common.protocol.instruct.tool_calls import FunctionCall
    from mistral_common.protocol.instruct.tool_calls import ToolCall as MistralToolCall
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    instruct = _instruct_tokenizer(version)
    message = AssistantMessage(
        tool_calls=[
            MistralToolCall(function=FunctionCall(name=name, arguments=arguments), **({"id": i} if i else {}))
            for name, arguments, i in calls
        ]
    )
    ids = instruct.encode_assistant_message(message, is_before_last_user_message=False)
    return instruct.tokenizer.decode(ids, special_token_policy=SpecialTokenPolicy.KEEP)


CALLS = [("move", {"direction": "left", "steps": 2}, "a1b2c3d4e"), ("look", {}, "Zz9Yy8Xx7")]


def test_parses_what_mistral_common_encodes_v3(parser):
    text = _encoded_text("v3", CALLS)
    assert text.startswith("[TOOL_CALLS][{") and text.endswith("</s>")
    assert parser.parse(text) == tuple(ToolCall(name, arguments, i) for name, arguments, i in CALLS)


def test_parses_what_mistral_common_encodes_v11(parser):
    text = _encoded_text("v11", CALLS)
    assert text == (
        '[TOOL_CALLS]move[CALL_ID]a1b2c3d4e[ARGS]{"direction": "left", "steps": 2}'
        "[TOOL_CALLS]look[CALL_ID]Zz9Yy8Xx7[ARGS]{}</s>"
    )
    assert parser.parse(text) == tuple(ToolCall(name, arguments, i) for name, arguments, i in CALLS)
