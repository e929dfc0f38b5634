"""Several agents on one episode: a planner and an executor, each with its own history, interleaving
their requests on one gateway session. Named (by path or by the ``X-Agent-ID`` header), each agent
is recorded in its own token-exact segment; unnamed, the same requests look like rewritten
histories and every request starts a segment of its own."""

import openai
import pytest
from gateway_helpers import ADD_TOOL

from rollforge.chat.render import token_fidelity_gap
from rollforge.gateway import Gateway
from rollforge.gateway.server import AGENT_HEADER
from rollforge.testing import assert_segment_exact, generated_ids

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def gateway(backend, renderer, parser):
    async with Gateway(backend, renderer, parser, model_name="tiny") as gateway:
        yield gateway


async def interleave(planner, executor):
    """planner, executor (a tool call), planner, executor (the answer): each sends its own history."""
    plan = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "Plan how to add 1 and 2."}]
    work = [{"role": "system", "content": "You execute."}, {"role": "user", "content": "Add 1 and 2."}]
    first = await planner(plan)
    call = await executor(work, tools=[ADD_TOOL])
    plan += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Check the result."}]
    await planner(plan)
    [tool_call] = call.choices[0].message.tool_calls
    work += [
        call.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tool_call.id, "content": "3"},
    ]
    answer = await executor(work, tools=[ADD_TOOL])
    assert answer.choices[0].message.content == "The sum is 3."


def sender(base_url, **headers):
    api = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, default_headers=headers)
    return lambda messages, **extra: api.chat.completions.create(model="tiny", messages=messages, **extra)


async def test_each_named_agent_gets_its_own_token_exact_segment(gateway, renderer):
    planner = sender(gateway.base_url("episode", agent="planner"))  # by path
    executor = sender(gateway.base_url("episode"), **{AGENT_HEADER: "executor"})  # by header
    await interleave(planner, executor)
    record_json = gateway.trajectory_json("episode")
    assert record_json["segment_agents"] == ["planner", "executor"]
    record = gateway.close_session("episode")
    assert record.turns == 4 and [s.agent for s in record.segments] == ["planner", "executor"]
    plan, work = record.segments
    assert [m.role for m in plan.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [m.role for m in work.messages] == ["system", "user", "assistant", "tool", "assistant"]
    for segment in record.segments:
        assert_segment_exact(segment, renderer, prompt_messages=2)
    end = renderer.stop_token_ids[0]
    assert generated_ids(plan) == (renderer.encode("Hello!") + [end]) * 2
    trajectory = record.trajectory(0, "episode", 1.0)
    assert token_fidelity_gap(trajectory, renderer) is None
    assert trajectory.segments[0].history == plan.messages and trajectory.messages == work.messages
    assert (
        trajectory.token_ids == plan.token_ids + work.token_ids
        and trajectory.loss_mask == plan.loss_mask + work.loss_mask
    )


async def test_unnamed_agents_on_one_session_fall_into_a_segment_per_request(gateway, renderer):
    await interleave(sender(gateway.base_url("mixed")), sender(gateway.base_url("mixed")))
    record = gateway.close_session("mixed")
    assert len(record.segments) == 4 and {s.agent for s in record.segments} == {""}
    assert token_fidelity_gap(record.trajectory(0, "mixed", 1.0), renderer) is None
