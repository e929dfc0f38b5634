"""The gateway through the real OpenAI Python SDK: plain, streaming, tool calls round trip, n and
logprobs, sessions by path and by header, errors in OpenAI's shape; recorded ids token-exact."""

import httpx
import openai
import pytest
from gateway_helpers import ADD_TOOL, CALL_TEXT

from rollforge.gateway import Gateway
from rollforge.gateway.server import SESSION_HEADER, TRACE_HEADER
from rollforge.testing import assert_segment_exact, generated_ids

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def gateway(backend, renderer, parser):
    async with Gateway(backend, renderer, parser, model_name="tiny") as gateway:
        yield gateway


def client(gateway, session=None, **kwargs):
    return openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="unused", max_retries=0, **kwargs)


async def test_plain_completion_is_recorded_token_exactly(gateway, renderer):
    assert gateway.host == "127.0.0.1" and gateway.base_url("s1").startswith("http://127.0.0.1:")
    reply = await client(gateway, "s1").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.choices[0].message.content == "Hello!" and reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None
    generated = renderer.encode("Hello!") + [renderer.stop_token_ids[0]]
    assert reply.usage.completion_tokens == len(generated)
    record = gateway.close_session("s1")
    assert record.turns == 1 and len(record.segments) == 1
    segment = record.segments[0]
    assert_segment_exact(segment, renderer, prompt_messages=1)
    assert generated_ids(segment) == generated and reply.usage.prompt_tokens == segment.prompt_length


async def test_streaming_delivers_the_same_reply(gateway, renderer):
    stream = await client(gateway, "s2").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello!"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(renderer.encode("Hello!")) + 1  # and <|im_end|>
    assert gateway.close_session("s2").turns == 1


async def test_tool_calls_round_trip_in_openai_format(gateway, renderer):
    api = client(gateway, "tools")
    messages = [{"role": "user", "content": "What is 1 + 2?"}]
    first = await api.chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, call.function.arguments) == ("function", "add", '{"a": 1, "b": 2}')
    messages += [choice.message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    second = await api.chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL])
    assert second.choices[0].message.content == "The sum is 3."

    record = gateway.close_session("tools")
    assert record.turns == 2 and len(record.segments) == 1  # the second request only appended
    segment = record.segments[0]
    assert [m.role for m in segment.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert segment.messages[2].content == CALL_TEXT  # the raw generated text, markup included
    assert segment.messages[3].tool_call_id == call.id and segment.messages[3].name == "add"
    assert_segment_exact(segment, renderer, prompt_messages=2)
    end = renderer.stop_token_ids[0]
    assert generated_ids(segment) == renderer.encode(CALL_TEXT) + [end] + renderer.encode("The sum is 3.") + [end]


async def test_n_choices_logprobs_and_the_chosen_one_continues(gateway, renderer):
    api = client(gateway, "n")
    messages = [{"role": "user", "content": "Hi"}]
    reply = await api.chat.completions.create(model="tiny", messages=messages, n=3, logprobs=True)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    tokens = reply.choices[1].logprobs.content
    assert "".join(t.token for t in tokens) == "Hello!" and all(t.logprob < 0 for t in tokens)
    messages += [reply.choices[2].message.model_dump(), {"role": "user", "content": "Again"}]
    await api.chat.completions.create(model="tiny", messages=messages)
    record = gateway.close_session("n")
    assert record.turns == 2 and len(record.segments) == 1
    assert_segment_exact(record.segments[0], renderer, prompt_messages=1)


async def test_header_sessions_models_and_errors(gateway):
    async with httpx.AsyncClient(base_url=gateway.base_url()) as http:
        for session in ("a", "b"):
            response = await http.post(
                "/chat/completions",
                headers={SESSION_HEADER: session},
                json={"messages": [{"role": "user", "content": "Hi"}]},
            )
            assert response.status_code == 200
        assert sorted(gateway.sessions) == ["a", "b"]
        bad = await http.post("/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]})
        assert bad.status_code == 400 and "'wizard' is not one of" in bad.json()["error"]["message"]
        assert (await http.post("/chat/completions", content=b"{not json")).status_code == 400
    models = await client(gateway).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    with pytest.raises(openai.BadRequestError, match="'n' must be an integer between 1 and 16"):
        await client(gateway, "c").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], n=99
        )


async def test_x_session_id_header_chooses_the_session(gateway):
    """verifiers sends one X-Session-ID per agent trace; the path and rollforge's own header come first."""
    async with httpx.AsyncClient(base_url=gateway.base_url()) as http:
        body = {"messages": [{"role": "user", "content": "Hi"}]}
        for trace in ("trace-a", "trace-b", "trace-a"):
            assert (await http.post("/chat/completions", headers={TRACE_HEADER: trace}, json=body)).status_code == 200
        both = {TRACE_HEADER: "trace-c", SESSION_HEADER: "ours"}
        assert (await http.post("/chat/completions", headers=both, json=body)).status_code == 200
    path = await client(gateway, "by-path").chat.completions.create(
        model="tiny", messages=body["messages"], extra_headers={TRACE_HEADER: "trace-d"}
    )
    assert path.choices[0].message.content == "Hello!"
    assert sorted(gateway.sessions) == ["by-path", "ours", "trace-a", "trace-b"]
    assert gateway.close_session("trace-a").turns == 2


@pytest.mark.parametrize(
    "field, value",
    [
        ("tool_choice", {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}}),
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}),
    ],
)
async def test_what_is_not_honoured_is_refused_naming_the_field(gateway, field, value):
    with pytest.raises(openai.BadRequestError, match=f"'{field}' .* is not honoured") as raised:
        await client(gateway, "refused").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=[ADD_TOOL], **{field: value}
        )
    assert raised.value.body["param"] == field and gateway.sessions["refused"].record().turns == 0


async def test_sessions_can_be_closed_to_outsiders(backend, renderer, parser):
    async with Gateway(backend, renderer, parser, open_sessions=False) as gateway:
        gateway.open_session("known")
        with pytest.raises(openai.NotFoundError, match="no open session 'other'"):
            await client(gateway, "other").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}]
            )
        await client(gateway, "known").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert gateway.close_session("known").turns == 1
