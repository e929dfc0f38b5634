"""The gateway carries images: an agent's ``image_url`` parts (chat), ``input_image`` items
(Responses) and ``image`` blocks (Anthropic Messages), sent with the OpenAI and Anthropic SDKs to the real server on 127.0.0.1, reach the tiny VLM's forward
pass and the recorded trajectory; remote URLs and a text-only policy are refused with a 400."""

from __future__ import annotations

import base64

import anthropic
import httpx
import openai
import pytest
import torch
from vision_helpers import picture

from rollforge.backends.hf_vision import HFVisionBackend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.toolcalls import get_parser
from rollforge.chat.vision import VisionRenderer
from rollforge.gateway import Gateway
from rollforge.json_forms import image_bytes, image_json

pytestmark = pytest.mark.timeout(120)


def data_url(image) -> str:
    form = image_json(image)
    return f"data:{form['mime']};base64,{form['base64']}"


def looking_at(image, text="What do you see?"):
    return {"role": "user", "content": [{"type": "text", "text": text}, image_url(image)]}


def image_url(image):
    return {"type": "image_url", "image_url": {"url": data_url(image), "detail": "auto"}}


def client(gateway, session):
    return openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="unused", max_retries=0)


@pytest.fixture
async def served(vlm):
    """(gateway over the tiny VLM, its renderer, its model)."""
    _, model, processor = vlm
    renderer = VisionRenderer(processor)
    backend = HFVisionBackend(model, processor)
    async with backend, Gateway(backend, renderer, get_parser("hermes"), model_name="tiny-vlm") as gateway:
        yield gateway, renderer, model


def generated_logprobs(model, renderer, trajectory, images):
    """The logprobs a forward pass over the trajectory's ids showing ``images`` gives its generated tokens."""
    ids = list(trajectory.token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids]), **renderer.images.inputs(ids, images)).logits[0].float()
    at = [k for k, m in enumerate(trajectory.loss_mask) if m]
    return logits.log_softmax(-1)[[k - 1 for k in at], [ids[k] for k in at]]


def expansion_at(ids, expansion, start=0) -> int:
    """Where ``expansion`` first starts in ``ids`` at or after ``start`` (-1: nowhere)."""
    n = len(expansion)
    return next((k for k in range(start, len(ids) - n + 1) if tuple(ids[k : k + n]) == expansion), -1)


async def test_a_chat_image_reaches_the_forward_pass_and_the_trajectory(served):
    gateway, renderer, model = served
    shown, other = picture(0), picture(2)  # the same size: the same number of image tokens
    reply = await client(gateway, "look").chat.completions.create(
        model="tiny-vlm", messages=[looking_at(shown)], max_tokens=4, seed=3, temperature=1.0
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    trajectory = gateway.trajectory("look")
    [user] = [m for m in trajectory.messages if m.role == "user"]
    sent = image_bytes(shown)[1]
    assert user.content == "What do you see?" and user.images == (sent,)  # the PNG as sent, byte for byte
    expansion = renderer.images.expansion(sent)
    assert expansion_at(trajectory.token_ids, expansion) >= 0  # the processor's expansion, in place
    assert trajectory.token_ids.count(renderer.images.placeholder_id) == renderer.images.tokens(sent)
    recorded = torch.tensor([lp for lp, m in zip(trajectory.logprobs, trajectory.loss_mask) if m])
    assert len(recorded) == reply.usage.completion_tokens >= 1
    # The sampler saw this picture: its logprobs are a forward pass's with it, not with another.
    assert torch.allclose(generated_logprobs(model, renderer, trajectory, [shown]), recorded, atol=1e-4)
    assert not torch.allclose(generated_logprobs(model, renderer, trajectory, [other]), recorded, atol=1e-4)
    async with httpx.AsyncClient() as http:  # the server runs on this event loop
        record = (await http.get(f"http://127.0.0.1:{gateway.port}/sessions/look/trajectory")).json()
    [user_json] = [m for m in record["messages"] if m["role"] == "user"]
    assert user_json["images"] == [{"type": "image", "mime": "image/png", "base64": base64.b64encode(sent).decode()}]


async def test_a_second_image_extends_the_same_segment_and_both_reach_the_model(served):
    gateway, renderer, _ = served
    api, first, second = client(gateway, "two"), picture(0), picture(1, (40, 48))
    messages = [looking_at(first)]
    reply = await api.chat.completions.create(model="tiny-vlm", messages=messages, max_tokens=3, seed=1)
    messages += [
        {"role": "assistant", "content": reply.choices[0].message.content or ""},
        looking_at(second, "And now?"),
    ]
    await api.chat.completions.create(model="tiny-vlm", messages=messages, max_tokens=3, seed=2)
    record = gateway.close_session("two")
    [segment] = record.segments  # one segment: the second request extended the first
    assert [m.images for m in segment.messages if m.images] == [(image_bytes(first)[1],), (image_bytes(second)[1],)]
    ids = segment.token_ids
    first_ids, second_ids = (renderer.images.expansion(image_bytes(p)[1]) for p in (first, second))
    at = expansion_at(ids, first_ids)
    assert (
        at >= 0 and expansion_at(ids, second_ids, at + len(first_ids)) > at
    )  # in order, each as the processor expands it
    assert ids.count(renderer.images.placeholder_id) == (first_ids + second_ids).count(renderer.images.placeholder_id)
    assert record.turns == 2 and not record.failures  # the backend got both images (else: a failed request)


async def test_a_responses_input_image_reaches_the_trajectory(served):
    gateway, renderer, _ = served
    shown = picture(3)
    item = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Describe it."},
            {"type": "input_image", "image_url": data_url(shown)},
        ],
    }
    response = await client(gateway, "resp").responses.create(model="tiny-vlm", input=[item], max_output_tokens=3)
    assert response.status in ("completed", "incomplete")
    trajectory = gateway.trajectory("resp")
    [user] = [m for m in trajectory.messages if m.role == "user"]
    assert user.content == "Describe it." and user.images == (image_bytes(shown)[1],)
    assert trajectory.token_ids.count(renderer.images.placeholder_id) == renderer.images.tokens(user.images[0])


async def test_anthropic_image_blocks_reach_the_trajectory_and_url_sources_are_refused(served):
    gateway, renderer, _ = served
    api = anthropic.AsyncAnthropic(base_url=gateway.base_url("claude").removesuffix("/v1"), api_key="x", max_retries=0)
    shown, screenshot = picture(0), picture(1, (40, 48))

    def block(image):
        form = image_json(image)
        return {"type": "image", "source": {"type": "base64", "media_type": form["mime"], "data": form["base64"]}}

    call = {"type": "tool_use", "id": "t1", "name": "look", "input": {}}
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "ok"}, block(screenshot)],
    }
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, block(shown)]},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    reply = await api.messages.create(model="tiny-vlm", max_tokens=3, messages=messages)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    trajectory = gateway.trajectory("claude")
    [user] = [m for m in trajectory.messages if m.role == "user"]
    [tool] = [m for m in trajectory.messages if m.role == "tool"]
    assert user.content == "What is this?" and user.images == (image_bytes(shown)[1],)
    assert tool.content == "ok" and tool.images == (image_bytes(screenshot)[1],)
    shown_tokens = sum(renderer.images.tokens(m.images[0]) for m in (user, tool))
    assert trajectory.token_ids.count(renderer.images.placeholder_id) == shown_tokens
    remote = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    with pytest.raises(anthropic.BadRequestError, match="'https://example.com/cat.png' is not fetched"):
        await api.messages.create(model="tiny-vlm", max_tokens=3, messages=[{"role": "user", "content": [remote]}])


async def test_a_remote_image_url_is_refused_naming_it(served):
    gateway, _, _ = served
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = {"model": "tiny-vlm", "messages": [{"role": "user", "content": [remote]}]}
    async with httpx.AsyncClient() as http:
        answer = await http.post(f"{gateway.base_url('remote')}/chat/completions", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "messages[0].content[0].image_url.url: the image URL 'https://example.com/cat.png' is not fetched: "
        "the gateway accepts only data: URLs (data:image/png;base64,...)"
    )
    item = {"role": "user", "content": [{"type": "input_image", "image_url": "http://example.com/a.jpg"}]}
    with pytest.raises(openai.BadRequestError, match="'http://example.com/a.jpg' is not fetched"):
        await client(gateway, "remote").responses.create(model="tiny-vlm", input=[item])
    assert gateway.trajectory("remote").turns == 0


async def test_a_text_only_policy_refuses_images(vlm):
    _, _, processor = vlm
    renderer = VisionRenderer(processor)
    backend = ScriptedBackend(lambda request: "Hello!", processor.tokenizer)
    async with Gateway(backend, renderer, get_parser("hermes")) as gateway:
        with pytest.raises(openai.BadRequestError, match="the policy does not accept images") as refused:
            await client(gateway, "text").chat.completions.create(model="m", messages=[looking_at(picture(0))])
        assert "ScriptedBackend is text-only (accepts_images=False)" in str(refused.value)
        reply = await client(gateway, "text").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}]
        )
        assert reply.choices[0].message.content == "Hello!"  # text still served on the same session
