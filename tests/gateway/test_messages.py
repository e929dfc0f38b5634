"""The gateway's Anthropic Messages route through the real ``anthropic`` SDK: plain, streamed, a
tool round trip, sessions by path and header, refusals naming the field, an SDK program run
unchanged by ``AgentEnvironment``; recorded ids token-exact."""

import sys

import httpx
import pytest
from gateway_helpers import ADD_TOOL

from rollforge.chat.render import token_fidelity_gap
from rollforge.errors import WireError
from rollforge.gateway import AgentEnvironment, Gateway
from rollforge.gateway.messages import chat_body
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import assert_segment_exact, generated_ids
from rollforge.types import Sample

anthropic = pytest.importorskip("anthropic")  # the `agents` extra (scripts/install.sh installs it)

pytestmark = pytest.mark.timeout(60)

ADD = {
    "name": "add",
    "description": ADD_TOOL["function"]["description"],
    "input_schema": ADD_TOOL["function"]["parameters"],
}


@pytest.fixture
async def gateway(backend, renderer, parser):
    async with Gateway(backend, renderer, parser, model_name="tiny") as gateway:
        yield gateway


@pytest.fixture
async def client(gateway):
    """An SDK client for a session (closed before the loop is); the SDK appends ``/v1/messages``
    to its base URL, the session's root."""
    clients = []

    def open_client(session):
        clients.append(
            anthropic.AsyncAnthropic(
                base_url=gateway.base_url(session).removesuffix("/v1"), api_key="unused", max_retries=0
            )
        )
        return clients[-1]

    yield open_client
    for opened in clients:
        await opened.close()


async def test_plain_message_is_recorded_token_exactly(gateway, client, renderer):
    reply = await client("m1").messages.create(
        model="tiny", max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": "Hi"}]
    )
    assert [(b.type, b.text) for b in reply.content] == [("text", "Hello!")]
    assert reply.stop_reason == "end_turn" and reply.role == "assistant" and reply.id.startswith("msg_")
    generated = renderer.encode("Hello!") + [renderer.stop_token_ids[0]]
    assert reply.usage.output_tokens == len(generated)
    record = gateway.close_session("m1")
    [segment] = record.segments
    assert [(m.role, m.content) for m in segment.messages[:2]] == [("system", "Be brief."), ("user", "Hi")]
    assert_segment_exact(segment, renderer, prompt_messages=2)
    assert generated_ids(segment) == generated and reply.usage.input_tokens == segment.prompt_length


async def test_streamed_message_sends_the_messages_events(gateway, client):
    events = []
    async with client("m2").messages.stream(
        model="tiny", max_tokens=64, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    ) as stream:
        async for event in stream:
            events.append(event.type)
        final = await stream.get_final_message()
    assert final.content[0].text == "Hello!" and final.stop_reason == "end_turn"
    assert [e for e in events if e not in ("text",)] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert gateway.close_session("m2").turns == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_round_trip_is_one_token_exact_segment(gateway, client, renderer, stream):
    api, session = client("tools"), "tools"
    messages = [{"role": "user", "content": "What is 1 + 2?"}]
    if stream:
        async with api.messages.stream(model="tiny", max_tokens=64, messages=messages, tools=[ADD]) as events:
            first = await events.get_final_message()
    else:
        first = await api.messages.create(model="tiny", max_tokens=64, messages=messages, tools=[ADD])
    assert first.stop_reason == "tool_use"
    [call] = first.content
    assert (call.type, call.name, call.input) == ("tool_use", "add", {"a": 1, "b": 2})
    messages += [
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3"}]},
    ]
    second = await api.messages.create(model="tiny", max_tokens=64, messages=messages, tools=[ADD])
    assert [b.text for b in second.content] == ["The sum is 3."] and second.stop_reason == "end_turn"
    trajectory = gateway.trajectory(session)
    assert trajectory.turns == 2 and token_fidelity_gap(trajectory, renderer) is None
    [segment] = gateway.close_session(session).segments
    assert [m.role for m in segment.messages][-3:] == ["assistant", "tool", "assistant"]
    assert_segment_exact(segment, renderer, prompt_messages=2)  # the fallback tool prompt is a system message


async def test_tool_choice_none_leaves_the_reply_as_text(gateway, client):
    reply = await client("none").messages.create(
        model="tiny",
        max_tokens=64,
        messages=[{"role": "user", "content": "What is 1 + 2?"}],
        tools=[ADD],
        tool_choice={"type": "none"},
    )
    assert reply.stop_reason == "end_turn" and [b.type for b in reply.content] == ["text"]


async def test_sessions_by_header_and_errors_in_anthropic_shape(gateway, client):
    async with httpx.AsyncClient(base_url=gateway.base_url().removesuffix("/v1")) as http:
        body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
        response = await http.post("/v1/messages", json=body, headers={"X-Session-ID": "trace-1"})
        assert response.status_code == 200 and response.json()["type"] == "message"
        assert "trace-1" in gateway.sessions
        bad = await http.post("/v1/messages", json={**body, "max_tokens": 0})
        assert bad.status_code == 400
        assert bad.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "'max_tokens' must be an integer >= 1, got 0"},
        }
    api = client("bad")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(  # images are taken (tests/vision/test_gateway_images.py), but these bytes are no image
        anthropic.BadRequestError, match=r"messages\[0\].content\[0\].source: the data: URL holds 1 bytes that are not"
    ):
        await api.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [image]}])
    with pytest.raises(anthropic.BadRequestError) as raised:
        await api.messages.create(
            model="tiny",
            max_tokens=8,
            messages=[{"role": "user", "content": "Hi"}],
            tools=[ADD],
            tool_choice={"type": "tool", "name": "subtract"},
        )
    assert raised.value.body["error"]["message"].startswith(
        "'tool_choice' names the function 'subtract', which is not one of"
    )
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [document]}
    with pytest.raises(
        anthropic.BadRequestError, match=r"messages\[0\].content\[0\].content holds a block of type 'document'"
    ):
        await api.messages.create(model="tiny", max_tokens=8, messages=[{"role": "user", "content": [result]}])
    with pytest.raises(anthropic.BadRequestError, match="'top_k' 5 is not honoured"):
        await api.messages.create(
            model="tiny", max_tokens=8, extra_body={"top_k": 5}, messages=[{"role": "user", "content": "Hi"}]
        )


def test_translation_onto_chat_completions():
    body = chat_body(
        {
            "model": "m",
            "max_tokens": 10,
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "stop_sequences": ["END"],
            "tool_choice": {"type": "any"},
            "tools": [ADD],
            "messages": [
                {"role": "user", "content": "Q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Let me add."},
                        {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "3"}]},
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        }
    )
    assert body["tools"] == [ADD_TOOL] and body["stop"] == ["END"] and body["max_tokens"] == 10
    assert body["tool_choice"] == "required"
    assert body["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "S"}]},
        {"role": "user", "content": [{"type": "text", "text": "Q"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Let me add."}],
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "3"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]


ANTHROPIC_AGENT = """
import json, os
import anthropic

row = json.loads(os.environ["ROLLFORGE_ROW"])
api = anthropic.Anthropic(max_retries=0)  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
tools = [TOOL]
messages = list(row["prompt"])
while True:
    reply = api.messages.create(model="policy", max_tokens=64, messages=messages, tools=tools)
    messages.append({"role": "assistant", "content": reply.content})
    calls = [b for b in reply.content if b.type == "tool_use"]
    if not calls:
        print(1.0 if str(row["answer"]) in reply.content[0].text else 0.0)
        break
    messages.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": c.id, "content": str(c.input["a"] + c.input["b"])} for c in calls]})
"""


async def test_an_anthropic_sdk_program_runs_unchanged_as_an_agent_environment(backend, renderer, tmp_path):
    program = tmp_path / "claude_agent.py"
    program.write_text(ANTHROPIC_AGENT.replace("TOOL", repr(ADD)))
    sample = Sample([{"role": "user", "content": "What is 1 + 2?"}], "agent", {"answer": 3})
    result = await arollout(
        [sample], {"agent": AgentEnvironment(cmd=[sys.executable, str(program)])}, backend, renderer, RolloutConfig()
    )
    [trajectory] = result.trajectories
    assert trajectory.error is None and trajectory.turns == 2 and trajectory.rewards == (0.0, 1.0)
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert token_fidelity_gap(trajectory, renderer) is None


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}, "tool_choice.disable_parallel_tool_use"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ],
)
def test_what_is_not_honoured_is_refused_naming_the_field(extra, field):
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    assert chat_body({**body, "thinking": {"type": "disabled"}})["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]}
    ]
    with pytest.raises(WireError) as raised:
        chat_body({**body, **extra})
    assert raised.value.param == field and field.split(".")[0].split("[")[0] in str(raised.value)
