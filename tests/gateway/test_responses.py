"""The gateway's Responses API (``POST /v1/responses``) through the real OpenAI SDK and openai-agents'
default model: text and item input, function tools round trip, streaming events, previous_response_id;
recorded exactly as the chat-completions path records (token-exact, the loss mask on generated ids)."""

import openai
import pytest
from gateway_helpers import ADD_TOOL, CALL_TEXT, assert_token_exact, generated_ids

from rollforge.chat.render import token_fidelity_gap
from rollforge.gateway import Gateway

pytestmark = pytest.mark.timeout(120)

#: ADD_TOOL in the Responses API's flat form.
ADD = {"type": "function", "name": "add", "description": ADD_TOOL["function"]["description"],
       "parameters": ADD_TOOL["function"]["parameters"]}


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
    assert [(m.role, m.content) for m in segment.messages] == [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!")]
    assert_token_exact(segment, renderer, prompt_messages=2)
    assert generated_ids(segment) == generated and reply.usage.input_tokens == segment.prompt_length
