"""``tool_choice`` ``required`` and a named function, honoured on chat completions, Responses and
Messages through the real SDKs: the family's call opener is forced before the generation, recorded
under mask 0 (no logprob), the policy generates the rest under mask 1, the reply is a call to the
(named) tool although the scripted policy calls none on its own, and the trajectory is token-exact.
Families that reason or whose templates render calls themselves (Qwen3, DeepSeek-R1, GPT-OSS, on
their real templates from TRL's wheel) stay token-exact too. A choice that cannot be honoured is a
400 naming ``tool_choice``."""

import copy
import json
import os

import openai
import pytest
from gateway_helpers import ADD_TOOL

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import token_fidelity_gap
from rollforge.chat.render import ChatRenderer
from rollforge.gateway import Gateway, Session
from rollforge.gateway.wire import parse_request
from rollforge.types import ToolCall

anthropic = pytest.importorskip("anthropic")  # the `agents` extra (scripts/install.sh installs it)

pytestmark = pytest.mark.timeout(120)

#: Hermes' openers (the tiny model's ChatML family): before the name, and up to the arguments.
REQUIRED = '<tool_call>\n{"name": "'
NAMED = '<tool_call>\n{"name": "add", "arguments": {'
#: What the scripted policy writes after each opener; on its own it answers in text.
AFTER = {REQUIRED: 'add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', NAMED: '"a": 1, "b": 2}}\n</tool_call>'}
ALONE = "I can add that in my head."


def policy(prompt: str) -> str:
    """Continues a forced opener; never calls a tool unprompted; answers a tool result."""
    for opener, rest in AFTER.items():
        if prompt.endswith(opener):
            return rest
    if prompt.rsplit("<|im_start|>", 2)[-2].startswith("tool\n"):
        return "The sum is 3."
    return ALONE


@pytest.fixture
def backend(tokenizer, renderer):
    return ScriptedBackend(lambda request: policy(renderer.decode(request.prompt_ids)), tokenizer)


@pytest.fixture
async def gateway(backend, renderer, parser):
    async with Gateway(backend, renderer, parser, model_name="tiny") as gateway:
        yield gateway


def assert_forced_then_generated(gateway, session, renderer, opener):
    """The one segment: prompt | the opener (mask 0, no logprob) | the policy's rest (mask 1) | ...;
    token-exact against the template's rendering."""
    trajectory = gateway.trajectory(session)
    [segment] = trajectory.segments
    forced, start = renderer.encode(opener), segment.prompt_length
    assert list(segment.token_ids[start : start + len(forced)]) == forced
    assert set(segment.loss_mask[: start + len(forced)]) == {0} and set(
        segment.logprobs[start : start + len(forced)]
    ) == {None}
    generated = renderer.encode(AFTER[opener]) + [renderer.stop_token_ids[0]]
    end = start + len(forced) + len(generated)
    assert list(segment.token_ids[start + len(forced) : end]) == generated and set(
        segment.loss_mask[start + len(forced) : end]
    ) == {1}
    assert None not in segment.logprobs[start + len(forced) : end]
    assert token_fidelity_gap(trajectory, renderer) is None
    return trajectory


CHOICES = {REQUIRED: "required", NAMED: {"type": "function", "function": {"name": "add"}}}


@pytest.mark.parametrize("opener", [REQUIRED, NAMED], ids=["required", "named"])
async def test_chat_completions_force_the_call_and_mask_the_opener(gateway, renderer, opener):
    api = openai.AsyncOpenAI(base_url=gateway.base_url("c"), api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is 1 + 2?"}]
    unforced = await openai.AsyncOpenAI(
        base_url=gateway.base_url("auto"), api_key="unused", max_retries=0
    ).chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL])
    assert unforced.choices[0].message.content == ALONE and unforced.choices[0].message.tool_calls is None
    reply = await api.chat.completions.create(
        model="tiny", messages=messages, tools=[ADD_TOOL], tool_choice=CHOICES[opener], logprobs=True
    )
    [call] = reply.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("add", {"a": 1, "b": 2})
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
    forced = renderer.encode(opener)
    assert [t.logprob for t in reply.choices[0].logprobs.content[: len(forced)]] == [0.0] * len(forced)
    assert reply.usage.completion_tokens == len(forced) + len(renderer.encode(AFTER[opener])) + 1
    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "3"},
    ]
    final = await api.chat.completions.create(model="tiny", messages=messages, tools=[ADD_TOOL])
    assert final.choices[0].message.content == "The sum is 3."
    trajectory = assert_forced_then_generated(gateway, "c", renderer, opener)
    assert trajectory.turns == 2 and trajectory.failures == ()


@pytest.mark.parametrize("opener", [REQUIRED, NAMED], ids=["required", "named"])
async def test_responses_force_the_call(gateway, renderer, opener):
    api = openai.AsyncOpenAI(base_url=gateway.base_url("r"), api_key="unused", max_retries=0)
    tool = {
        "type": "function",
        "name": "add",
        "description": "Add two integers.",
        "parameters": ADD_TOOL["function"]["parameters"],
    }
    choice = "required" if opener == REQUIRED else {"type": "function", "name": "add"}
    response = await api.responses.create(model="tiny", input="What is 1 + 2?", tools=[tool], tool_choice=choice)
    [item] = response.output
    assert (item.type, item.name, json.loads(item.arguments)) == ("function_call", "add", {"a": 1, "b": 2})
    assert_forced_then_generated(gateway, "r", renderer, opener)


@pytest.mark.parametrize("opener", [REQUIRED, NAMED], ids=["any", "tool"])
async def test_messages_force_the_tool_use(gateway, renderer, opener):
    api = anthropic.AsyncAnthropic(base_url=gateway.base_url("m").removesuffix("/v1"), api_key="unused", max_retries=0)
    tool = {"name": "add", "description": "Add two integers.", "input_schema": ADD_TOOL["function"]["parameters"]}
    choice = {"type": "any"} if opener == REQUIRED else {"type": "tool", "name": "add"}
    reply = await api.messages.create(
        model="tiny",
        max_tokens=64,
        messages=[{"role": "user", "content": "What is 1 + 2?"}],
        tools=[tool],
        tool_choice=choice,
    )
    await api.close()
    [block] = reply.content
    assert (block.type, block.name, block.input, reply.stop_reason) == ("tool_use", "add", {"a": 1, "b": 2}, "tool_use")
    assert_forced_then_generated(gateway, "m", renderer, opener)


class NameFirstParser:
    """A call format with the tool's name first (``add {"a": 1}``): nothing precedes the name, so
    there is no opener to force."""

    markers = ()

    def parse(self, text):
        name, _, arguments = text.partition(" ")
        return (ToolCall(name, json.loads(arguments or "{}")),) if name.isidentifier() else ()

    def write(self, call):
        return f"{call.name} {json.dumps(dict(call.arguments))}"

    def system_prompt(self, tools):
        return "Call a tool by writing its name and its JSON arguments."


@pytest.mark.parametrize(
    "choice, tools, message",
    [
        (
            {"type": "function", "function": {"name": "subtract"}},
            [ADD_TOOL],
            "names the function 'subtract', which is not one of",
        ),
        ("required", None, "'required' needs 'tools'"),
        (
            "required",
            [ADD_TOOL],
            "cannot be honoured for the chatml family: its written call 'rollforge_probe_tool {}' has no clean opener",
        ),
    ],
)
async def test_a_choice_that_cannot_be_honoured_is_a_400_naming_tool_choice(backend, renderer, choice, tools, message):
    async with Gateway(backend, renderer, NameFirstParser()) as gateway:
        api = openai.AsyncOpenAI(base_url=gateway.base_url("x"), api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match=message) as raised:
            await api.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "x"}],
                tool_choice=choice,
                **({"tools": tools} if tools else {}),
            )
        assert raised.value.body["param"] == "tool_choice" and gateway.trajectory("x").turns == 0 and backend.calls == 0


#: family -> (its template in TRL's wheel, its control tokens, bos, eos)
TEMPLATES = {
    "qwen3": ("qwen3", ["<|im_start|>", "<|im_end|>"], None, "<|im_end|>"),
    "deepseek": (
        "deepseekv3",
        [
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁call▁end｜>",
            "<｜tool▁sep｜>",
        ],
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
    ),
    "gpt_oss": (
        "gptoss",
        ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"],
        None,
        "<|return|>",
    ),
}


def family_renderer(tokenizer, family):
    trl = pytest.importorskip("trl")
    template, specials, bos, eos = TEMPLATES[family]
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    tokenizer.bos_token, tokenizer.eos_token = bos or tokenizer.bos_token, eos
    with open(
        os.path.join(os.path.dirname(trl.__file__), "chat_templates", template + ".jinja"), encoding="utf-8"
    ) as f:
        tokenizer.chat_template = f.read()
    renderer = ChatRenderer(tokenizer)
    assert renderer.family.name == family
    return renderer


@pytest.mark.parametrize("family", sorted(TEMPLATES))
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "add"}}], ids=["required", "named"]
)
async def test_families_that_reason_or_render_calls_stay_token_exact(tokenizer, family, choice):
    renderer = family_renderer(tokenizer, family)
    written = renderer.parser().write(ToolCall("add", {"a": 1, "b": 2}))

    def continue_the_call(request):  # the rest of the call after the longest end of the prompt it starts
        prompt = renderer.decode(request.prompt_ids)
        return next(
            written[written.index(prompt[-k:]) + k :] for k in range(len(written), 0, -1) if prompt[-k:] in written
        )

    backend = ScriptedBackend(continue_the_call, renderer.tokenizer, end_token_id=renderer.stop_token_ids[0])
    session = Session("s", renderer, renderer.parser())
    request = parse_request(
        {"messages": [{"role": "user", "content": "What is 1 + 2?"}], "tools": [ADD_TOOL], "tool_choice": choice}
    )
    [reply], _ = await session.complete(request, backend)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("add", {"a": 1, "b": 2})]
    trajectory = session.record().trajectory(0, "t", 1.0)
    forced = trajectory.loss_mask.index(1) - trajectory.prompt_length
    assert forced > 0 and renderer.decode(trajectory.token_ids[trajectory.prompt_length :]).startswith(
        renderer.reasoning_text("")
    )
    assert token_fidelity_gap(trajectory, renderer) is None
