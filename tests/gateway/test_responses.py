"""The gateway's Responses API (``POST /v1/responses``) through the real OpenAI SDK and openai-agents'
default model: text and item input, function tools round trip, streaming events, previous_response_id;
recorded exactly as the chat-completions path records (token-exact, the loss mask on generated ids)."""

import openai
import pytest
from gateway_helpers import ADD_TOOL, CALL_TEXT, assert_add_round_trip

from rollforge.gateway import Gateway
from rollforge.testing import assert_segment_exact, generated_ids

pytestmark = pytest.mark.timeout(120)

#: ADD_TOOL in the Responses API's flat form.
ADD = {
    "type": "function",
    "name": "add",
    "description": ADD_TOOL["function"]["description"],
    "parameters": ADD_TOOL["function"]["parameters"],
}


@pytest.fixture
async def gateway(backend, renderer, parser):
    async with Gateway(backend, renderer, parser, model_name="tiny") as gateway:
        yield gateway


def client(gateway, session=None):
    return openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="unused", max_retries=0)


async def test_text_input_is_answered_and_recorded_token_exactly(gateway, renderer):
    reply = await client(gateway, "s").responses.create(model="tiny", input="Hi", instructions="Be brief.")
    assert reply.status == "completed" and reply.output_text == "Hello!"
    [item] = reply.output
    assert item.type == "message" and item.role == "assistant"
    generated = renderer.encode("Hello!") + [renderer.stop_token_ids[0]]
    assert reply.usage.output_tokens == len(generated)
    record = gateway.close_session("s")
    [segment] = record.segments
    assert [(m.role, m.content) for m in segment.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello!"),
    ]
    assert_segment_exact(segment, renderer, prompt_messages=2)
    assert generated_ids(segment) == generated and reply.usage.input_tokens == segment.prompt_length


async def test_a_reply_cut_by_max_output_tokens_is_incomplete(gateway, renderer):
    reply = await client(gateway, "short").responses.create(model="tiny", input="Hi", max_output_tokens=2)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 2 and reply.output_text == renderer.decode(renderer.encode("Hello!")[:2])


async def test_function_tools_round_trip_as_items(gateway, renderer):
    api = client(gateway, "tools")
    items = [{"role": "user", "content": "What is 1 + 2?"}]
    first = await api.responses.create(model="tiny", input=items, tools=[ADD], tool_choice="auto")
    [call] = first.output
    assert (call.type, call.name, call.arguments) == ("function_call", "add", '{"a": 1, "b": 2}')
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "3"})
    second = await api.responses.create(model="tiny", input=items, tools=[ADD])
    assert second.output_text == "The sum is 3."

    record = gateway.close_session("tools")
    assert record.turns == 2 and len(record.segments) == 1  # the second request only appended
    [segment] = record.segments
    assert [m.role for m in segment.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert segment.messages[2].content == CALL_TEXT and segment.messages[3].tool_call_id == call.call_id
    assert_segment_exact(segment, renderer, prompt_messages=2)
    end = renderer.stop_token_ids[0]
    assert generated_ids(segment) == renderer.encode(CALL_TEXT) + [end] + renderer.encode("The sum is 3.") + [end]


async def test_streaming_sends_the_responses_event_sequence(gateway):
    api = client(gateway, "stream")
    stream = await api.responses.create(model="tiny", input="What is 1 + 2?", tools=[ADD], stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    call = events[-1].response.output[0]
    assert (call.name, call.arguments) == ("add", '{"a": 1, "b": 2}')
    followup = [
        {"role": "user", "content": "What is 1 + 2?"},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "3"},
    ]
    stream = await api.responses.create(model="tiny", input=followup, tools=[ADD], stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events][2:-1] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "The sum is 3."
    assert events[-1].response.output_text == "The sum is 3."
    assert gateway.close_session("stream").turns == 2


async def test_previous_response_id_is_served_from_the_session_or_refused(gateway, renderer):
    api = client(gateway, "chain")
    first = await api.responses.create(model="tiny", input="What is 1 + 2?", tools=[ADD])
    [call] = first.output
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "3"}
    second = await api.responses.create(model="tiny", input=[output], tools=[ADD], previous_response_id=first.id)
    assert second.output_text == "The sum is 3." and second.previous_response_id == first.id
    with pytest.raises(
        openai.BadRequestError, match="'previous_response_id' 'resp_elsewhere' is not a response of this session"
    ):
        await api.responses.create(model="tiny", input="Hi", previous_response_id="resp_elsewhere")
    with pytest.raises(
        openai.BadRequestError, match="previous_response_id"
    ):  # other sessions' responses are not shared
        await client(gateway, "other").responses.create(model="tiny", input="Hi", previous_response_id=first.id)
    record = gateway.close_session("chain")
    assert record.turns == 2 and len(record.segments) == 1
    assert_segment_exact(record.segments[0], renderer, prompt_messages=2)


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0] is of type 'reasoning'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].image_url: the image URL 'x' is not fetched: the gateway accepts only data: URLs",
        ),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0] of type 'web_search' is not supported"),
        ({"input": "Hi", "text": {"format": {"type": "json_object"}}}, "'text.format'"),
        ({"input": "Hi", "conversation": "conv_1"}, "'conversation' is not supported"),
        ({"input": []}, "'input' must be a string or a non-empty list"),
        ({"input": "Hi", "max_output_tokens": 0}, "'max_output_tokens' must be an integer >= 1"),
    ],
)
async def test_what_the_gateway_cannot_serve_is_a_400_naming_the_field(gateway, fields, named):
    with pytest.raises(openai.BadRequestError, match=named.replace("[", r"\[").replace("]", r"\]")):
        await client(gateway, "bad").responses.create(model="tiny", **fields)


async def agents_default_model_agent(base_url, row):
    """openai-agents with its default model class (``OpenAIResponsesModel``: ``POST /v1/responses``);
    reward 1 when its final output has the answer."""
    agents = pytest.importorskip("agents")

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    # its own client: openai-agents' default client shares one httpx client across event loops, which
    # breaks on the second loop (each rollout() / train() runs its own)
    provider = agents.OpenAIProvider(openai_client=openai.AsyncOpenAI(base_url=base_url, api_key="unused"))
    agent = agents.Agent(name="adder", instructions="You add numbers.", model="policy", tools=[add])
    config = agents.RunConfig(model_provider=provider, tracing_disabled=True)
    if row["id"] % 2:
        streamed = agents.Runner.run_streamed(agent, row["prompt"][-1]["content"], run_config=config, max_turns=3)
        async for _ in streamed.stream_events():
            pass
        answer = streamed.final_output
    else:
        answer = (
            await agents.Runner.run(agent, row["prompt"][-1]["content"], run_config=config, max_turns=3)
        ).final_output
    return 1.0 if str(row["answer"]) in answer else 0.0


async def test_openai_agents_default_model_runs_through_the_responses_api(backend, renderer):
    pytest.importorskip("agents")  # the `agents` extra (scripts/install.sh installs it)
    from rollforge.gateway import AgentEnvironment
    from rollforge.rollout.config import RolloutConfig
    from rollforge.rollout.engine import arollout
    from rollforge.types import Sample

    samples = [
        Sample([{"role": "user", "content": f"What is 1 + 2? ({i})"}], "agent", {"answer": 3, "id": i})
        for i in range(2)
    ]
    result = await arollout(
        samples, {"agent": AgentEnvironment(agents_default_model_agent)}, backend, renderer, RolloutConfig()
    )
    for trajectory in result.trajectories:  # one plain run, one streamed
        assert_add_round_trip(trajectory, renderer)


async def test_the_session_header_selects_the_session_as_for_chat_completions(gateway):
    from rollforge.gateway.server import SESSION_HEADER

    api = openai.AsyncOpenAI(
        base_url=gateway.base_url(), api_key="unused", max_retries=0, default_headers={SESSION_HEADER: "by-header"}
    )
    await api.responses.create(model="tiny", input="Hi")
    assert gateway.close_session("by-header").turns == 1
