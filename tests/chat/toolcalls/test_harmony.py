"""GPT-OSS harmony tool calls (rollforge.chat.toolcalls.harmony), checked against the gpt-oss chat
template (TRL's wheel) and, where an offline build is installed, against ``openai_harmony``'s own
completion parser."""

from __future__ import annotations

import json

import pytest

from rollforge.chat.toolcalls import HarmonyParser, get_parser
from rollforge.types import ToolCall

REPLY = (
    "<|channel|>analysis<|message|>I should check the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris"}<|call|>'
)
MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move the player.",
        "parameters": {
            "type": "object",
            "properties": {
                "direction": {"type": "string", "enum": ["left", "right"], "description": "Where to."},
                "steps": {"type": "integer", "default": 1},
                "tags": {"type": "array", "items": {"type": "string"}},
                "note": {"type": ["string", "null"]},
            },
            "required": ["direction"],
        },
    },
}


@pytest.fixture
def parser() -> HarmonyParser:
    return get_parser("harmony")


def test_call_after_analysis(parser):
    assert parser.parse(REPLY) == (ToolCall("get_weather", {"city": "Paris"}),)
    assert isinstance(get_parser("gpt_oss"), HarmonyParser)


def test_recipient_in_the_role_header_and_final_answers(parser):
    text = "<|start|>assistant to=functions.look<|channel|>commentary json<|message|>{}<|call|>"
    assert parser.parse(text) == (ToolCall("look", {}),)
    assert (
        parser.parse("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>")
        == ()
    )


def test_other_recipients_pass_through_as_unknown_tools(parser):
    text = '<|channel|>analysis to=browser.search code<|message|>{"query": "x"}<|call|>'
    assert parser.parse(text) == (ToolCall("browser.search", {"query": "x"}),)


def test_cut_generations(parser):
    assert parser.parse(REPLY.removesuffix("<|call|>") + "<|ca") == (ToolCall("get_weather", {"city": "Paris"}),)
    assert parser.parse("Set the width to=5 and go.") == ()  # prose, not a header
    cut = "<|channel|>commentary to=functions.get_weather <|constrain|>json"
    assert parser.parse(cut) == (
        ToolCall("get_weather", {}, error="tool call get_weather: the reply ends before <|message|> and the arguments"),
    )


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"city": ', "invalid JSON in the arguments of tool call get_weather: Expecting value at char 9"),
        ('{"city": "x"} thanks', "tool call get_weather: text follows its JSON arguments before <|call|>"),
        ('"Paris"', '"arguments" of tool call get_weather is a string but not valid JSON: Expecting value at char 0'),
        ("[1]", '"arguments" of tool call get_weather must be a JSON object, got array'),
        ('{"n": -Infinity}', "invalid JSON in the arguments of tool call get_weather: -Infinity is not a JSON number"),
    ],
)
def test_malformed_arguments_are_error_calls(parser, body, error):
    text = f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{body}<|call|>"
    assert parser.parse(text) == (ToolCall("get_weather", {}, error=error),)


def test_parses_what_the_gpt_oss_template_renders(parser, trl_template, rendered_reply):
    call = {"type": "function", "function": {"name": "move", "arguments": {"direction": "left", "steps": 2}}}
    reply = rendered_reply(trl_template("gptoss"), {"role": "assistant", "content": "", "tool_calls": [call]})
    assert (
        reply
        == '<|start|>assistant to=functions.move<|channel|>commentary json<|message|>{"direction": "left", "steps": 2}<|call|>'
    )
    assert parser.parse(reply) == (ToolCall("move", {"direction": "left", "steps": 2}),)


def _offline_harmony():
    harmony = pytest.importorskip("openai_harmony")
    try:
        return harmony, harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # the upstream build downloads its vocabulary: not possible offline
        pytest.skip(f"openai_harmony cannot load its encoding offline: {exc}")


@pytest.mark.parametrize(
    "text",
    [
        REPLY,
        "<|start|>assistant to=functions.look<|channel|>commentary json<|message|>{}<|call|>",
        '<|channel|>commentary to=functions.a <|constrain|>json<|message|>{"x": [1, 2]}<|end|>'
        '<|start|>assistant<|channel|>commentary to=functions.b<|message|>{"y": {"z": "w"}}<|call|>',
    ],
)
def test_agrees_with_openai_harmony(parser, text):
    harmony, encoding = _offline_harmony()
    tokens = encoding.encode(text, allowed_special="all")
    # a completion starts after "<|start|>assistant" unless it writes its own header
    role = None if text.startswith("<|start|>") else harmony.Role.ASSISTANT
    messages = encoding.parse_messages_from_completion_tokens(tokens, role)
    expected = [(m.recipient.removeprefix("functions."), m.content[0].text) for m in messages if m.recipient]
    calls = parser.parse(text)
    assert [(c.name, c.arguments) for c in calls] == [(name, json.loads(body)) for name, body in expected]


def test_system_prompt_declares_tools_as_harmony_does(parser):
    prompt = parser.system_prompt([MOVE])
    assert prompt.startswith(
        "# Tools\n\n## functions\n\nnamespace functions {\n\n"
        "// Move the player.\n"
        "type move = (_: {\n"
        "// Where to.\n"
        'direction: "left" | "right",\n'
        "steps?: number, // default: 1\n"
        "tags?: string[],\n"
        "note?: string | null,\n"
        "}) => any;\n\n"
        "} // namespace functions\n\n"
    )
    example = next(line for line in prompt.splitlines() if line.startswith("<|channel|>commentary"))
    assert parser.parse(example) == (ToolCall("move", {"direction": "left"}),)


def test_system_prompt_matches_openai_harmony_rendering(parser):
    harmony, encoding = _offline_harmony()
    function = MOVE["function"]
    tool = harmony.ToolDescription.new(function["name"], function["description"], parameters=function["parameters"])
    developer = harmony.DeveloperContent.new().with_function_tools([tool])
    conversation = harmony.Conversation.from_messages(
        [harmony.Message.from_role_and_content(harmony.Role.DEVELOPER, developer)]
    )
    rendered = encoding.decode_utf8(encoding.render_conversation(conversation))
    declared = rendered.removeprefix("<|start|>developer<|message|>").removesuffix("<|end|>")
    assert parser.system_prompt([MOVE]).startswith(declared + "\n\n")
