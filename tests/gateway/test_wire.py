"""The OpenAI wire format: requests normalised for comparison, bad fields named, responses shaped."""

import re

import pytest

from rollforge.errors import WireError
from rollforge.gateway.wire import Choice, WireCall, WireMessage, completion_body, parse_request, stream_chunks


def test_messages_are_normalised_so_an_echoed_history_compares_equal():
    sent = parse_request(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
                {"role": "user", "content": "Hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "audio": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"b": 2,  "a": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "3"},
            ]
        }
    )
    assert sent.messages == (
        WireMessage("system", "Be brief."),
        WireMessage("user", "Hi"),
        WireMessage("assistant", "", (WireCall("c1", "add", '{"a": 1, "b": 2}'),)),
        WireMessage("tool", "3", tool_call_id="c1"),
    )
    assert sent.n == 1 and sent.tool_choice == "auto" and not sent.stream and sent.tools_key == ""


@pytest.mark.parametrize(
    "body, message",
    [
        ({"messages": []}, "'messages' must be a non-empty list"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "must hold the image's URL",
        ),
        ({"messages": [{"role": "tool", "content": "3"}]}, "needs the string 'tool_call_id'"),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperature": 3},
            "'temperature' must be a number in [0.0, 2.0]",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, "'top_p' must be a number in (0.0, 1.0]"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "'max_tokens' must be an integer >= 1"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, "at most 4 strings"),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 5}, "'top_logprobs' is not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "always"}, "'tool_choice' 'always'"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "'tools' must be a list"),
    ],
)
def test_bad_requests_name_the_field(body, message):
    with pytest.raises(WireError, match=re.escape(message)) as error:
        parse_request(body)
    assert error.value.status == 400 and error.value.body()["error"]["type"] == "invalid_request_error"


def test_responses_in_openai_shape():
    call = WireCall("c1", "add", '{"a": 1}')
    choices = [Choice(None, (call,), "tool_calls", None, 7), Choice("Hi", (), "stop", (("H", -0.5), ("i", -0.25)), 3)]
    body = completion_body("id1", "m", 5, choices, prompt_tokens=11)
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
    }
    assert [t["logprob"] for t in body["choices"][1]["logprobs"]["content"]] == [-0.5, -0.25]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 10, "total_tokens": 21}
    chunks = list(stream_chunks("id1", "m", 5, choices[1:], 11, include_usage=True))
    assert [c["choices"][0]["delta"] if c["choices"] else "usage" for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"content": "Hi"},
        {},
        "usage",
    ]
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"


def test_messages_equal_to_the_previous_requests_are_not_parsed_again():
    first = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    known = (first, parse_request({"messages": first}).messages)
    again = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    parsed = parse_request({"messages": again}, known).messages
    assert parsed[0] is known[1][0] and parsed[1] is known[1][1]  # reused
    assert parsed == parse_request({"messages": again}).messages
    edited = [{"role": "user", "content": "Hi!"}, *again[1:]]
    assert parse_request({"messages": edited}, known).messages[0] == WireMessage("user", "Hi!")
