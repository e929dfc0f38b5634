"""Every parser, on hostile model output: linear time, and never an exception.

Each family wraps the same malformed arguments in its own call format; whatever is wrong must come
back as a ``ToolCall`` with ``error`` set (the environment counts it as ``tool_invalid_json``),
carrying the tool name where the format makes it readable.
"""

from __future__ import annotations

import random
import time

import pytest

from rollforge.chat.toolcalls import PARSER_NAMES, decoding, get_parser
from rollforge.types import ToolCall

#: One call of tool ``move`` with ``@ARGS@`` as its JSON arguments, per family.
CALL = {
    "hermes": '<tool_call>\n{"name": "move", "arguments": @ARGS@}\n</tool_call>',
    "llama3_json": '{"name": "move", "parameters": @ARGS@}',
    "mistral": "[TOOL_CALLS]move[ARGS]@ARGS@</s>",
    "deepseek": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>move\n```json\n@ARGS@\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "harmony": "<|channel|>commentary to=functions.move <|constrain|>json<|message|>@ARGS@<|call|>",
}
CALL["qwen"] = CALL["hermes"]
CALL["gpt_oss"] = CALL["harmony"]

HOSTILE_ARGUMENTS = {
    "deep nesting": '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "nesting past the limit": '{"a": ' + "[" * 70 + "]" * 70 + "}",
    "5,000-digit integer": '{"n": ' + "7" * 5000 + "}",
    "lone surrogate escape": '{"s": "\\ud800"}',
    "raw lone surrogate": '{"s": "\ud800"}',
    "surrogate in a key": '{"\\udfff": 1}',
    "NaN": '{"x": NaN}',
    "Infinity": '{"x": Infinity}',
    "-Infinity": '{"x": -Infinity}',
    "overflowing float": '{"x": 1e999}',
    "overflowing negative float": '{"x": -2.5e400}',
}


@pytest.mark.parametrize("family", sorted(CALL))
@pytest.mark.parametrize("problem", sorted(HOSTILE_ARGUMENTS))
def test_hostile_arguments_become_error_calls(family, problem):
    text = CALL[family].replace("@ARGS@", HOSTILE_ARGUMENTS[problem])
    calls = get_parser(family).parse(text)
    assert len(calls) == 1 and calls[0].error, calls
    assert calls[0].name == "move" and calls[0].arguments == {}


def test_qwen3_coder_never_raises_on_hostile_values():
    parser = get_parser("qwen3_coder")
    for value in HOSTILE_ARGUMENTS.values():
        (call,) = parser.parse(
            f"<tool_call>\n<function=move>\n<parameter=a>\n{value}\n</parameter>\n</function>\n</tool_call>"
        )
        assert call.name == "move" and call.error is None and call.arguments == {"a": value}  # left to validation


def test_error_messages_say_what_is_wrong():
    parse = get_parser("hermes").parse
    error = lambda args: parse(CALL["hermes"].replace("@ARGS@", args))[0].error  # noqa: E731
    assert error('{"x": NaN}') == "invalid JSON in <tool_call>: NaN is not a JSON number"
    assert error('{"x": 1e999}') == "invalid JSON in <tool_call>: number 1e999 is out of range for a double"
    assert (
        error(HOSTILE_ARGUMENTS["deep nesting"]) == "invalid JSON in <tool_call>: JSON nested more than 64 levels deep"
    )
    assert (
        error(HOSTILE_ARGUMENTS["nesting past the limit"])
        == "invalid JSON in <tool_call>: JSON nested more than 64 levels deep"
    )
    assert error('{"s": "\\ud800"}') == "invalid JSON in <tool_call>: string holds a lone UTF-16 surrogate"
    assert error(HOSTILE_ARGUMENTS["5,000-digit integer"]).startswith(
        "invalid JSON in <tool_call>: unreadable number: "
    )
    # 64 levels are fine: the call object, its arguments and 62 arrays
    assert parse(CALL["hermes"].replace("@ARGS@", '{"a": ' + "[" * 62 + "]" * 62 + "}"))[0].error is None


def test_a_generation_cut_inside_the_closing_tag_keeps_the_call():
    text = '<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call'
    for cut in range(len("</tool_call>")):
        (call,) = get_parser("hermes").parse(text[: len(text) - cut])
        assert call.name == "move" and call.arguments == {"direction": "left"} and call.error is None


#: Fragments that, repeated to 200 KB, send a careless parser into quadratic time.
ADVERSARIAL_UNITS = (
    "<tool_call>",
    "<tool_call>{",
    '<tool_call>{"name": "',
    "</tool_call><tool_call>",
    "[TOOL_CALLS]",
    "[TOOL_CALLS]a[ARGS]{",
    "[TOOL_CALLS] [{",
    "<function=",
    "<function=f>",
    "<function=f><parameter=",
    "<function=f><parameter=a>\n1",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n",
    "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{",
    "<|message|>",
    " to=functions.f<|message|>",
    ' to=functions.f<|message|>{"',
    "<|start|>assistant to=",
    "{",
    "[",
    '{"a":',
    '"',
    "\\",
    " ",
)


def _worst_seconds(name: str) -> float:
    """The most CPU seconds this thread spent parsing one 200 KB adversarial reply: work done, which
    other processes loading the machine do not inflate as they would a wall-clock time."""
    parser, worst = get_parser(name), 0.0
    for unit in ADVERSARIAL_UNITS:
        text = unit * (200_000 // len(unit))
        started = time.thread_time()
        parser.parse(text)
        worst = max(worst, time.thread_time() - started)
    return worst


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_parsing_is_linear_in_the_reply(name):
    # a complexity guard, not a benchmark: quadratic parsing takes tens of CPU seconds here (the old
    # Hermes regex took 10-30 s on 110 KB of "<tool_call>"); linear parsing takes milliseconds, so
    # the bound is hundreds of times what a linear parser needs
    assert _worst_seconds(name) < 1.0, f"{name} is too slow on a 200 KB reply"


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_parsing_without_the_call_cap_is_linear_too(name, monkeypatch):
    """The same replies with every call read (thousands of error calls): still linear."""
    monkeypatch.setattr(decoding, "MAX_CALLS", 10**9)
    assert _worst_seconds(name) < 3.0, f"{name} is too slow on a 200 KB reply"


#: Pieces of every family's markup and of JSON, hostile values and stray characters.
FRAGMENTS = (
    *ADVERSARIAL_UNITS,
    "</tool_call>",
    "</function>",
    "</parameter>",
    "[ARGS]",
    "[CALL_ID]",
    "</s>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "```json\n",
    "```",
    "<|channel|>",
    "commentary",
    "<|constrain|>json",
    "<|call|>",
    "<|end|>",
    "<|return|>",
    "<|python_tag|>",
    '"name": "move"',
    '"arguments": ',
    '"parameters": ',
    "}",
    "]",
    ",",
    ":",
    "NaN",
    "-Infinity",
    "1e999",
    "9" * 4400,
    "\\ud800",
    "\ud800",
    "null",
    "true",
    '"\\u0000"',
    "\n",
    "move",
    "é",
    "𝔘",
    "\x00",
)


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_random_markup_never_raises(name):
    parser, rng = get_parser(name), random.Random(name)
    for _ in range(3000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))
        for call in parser.parse(text):
            assert isinstance(call.name, str) and isinstance(call.arguments, dict)
            assert call.error is None or call.arguments == {}
            # names and error messages go back to the model: no lone surrogate may reach the tokenizer
            call.name.encode("utf-8"), (call.error or "").encode("utf-8")


MANY = {
    "hermes": '<tool_call>{"name": "look", "arguments": {}}</tool_call>',
    "llama3_json": None,  # one call per reply by design
    "mistral": "[TOOL_CALLS]look[ARGS]{}",
    "qwen3_coder": "<tool_call>\n<function=look>\n</function>\n</tool_call>",
    "deepseek": "<｜tool▁call▁begin｜>look<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
    "harmony": "<|start|>assistant<|channel|>commentary to=functions.look<|message|>{}<|call|>",
}


@pytest.mark.parametrize("family", [f for f, call in MANY.items() if call])
def test_at_most_128_calls_are_read_from_one_reply(family):
    parser = get_parser(family)
    assert parser.parse(MANY[family] * 128) == (ToolCall("look", {}),) * 128
    calls = parser.parse(MANY[family] * 5000)
    assert calls[:128] == (ToolCall("look", {}),) * 128
    assert calls[128:] == (ToolCall("", {}, error="more than 128 tool calls in one reply; the rest were not read"),)
    json_list = "[TOOL_CALLS] [" + ", ".join(['{"name": "look", "arguments": {}}'] * 300) + "]"
    assert len(get_parser("mistral").parse(json_list)) == 129
