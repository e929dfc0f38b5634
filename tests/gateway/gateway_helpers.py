"""Helpers shared by the gateway tests (a module of its own: ``conftest`` names collide across
test directories)."""

from __future__ import annotations

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    },
}
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def reply_for(prompt: str) -> str:
    """The scripted model: calls ``add`` when tools are offered and no result came back yet,
    answers with the result when one did, else greets."""
    last_turn = prompt.rsplit("<|im_start|>", 2)[-2]
    if last_turn.startswith("tool\n"):
        return "The sum is " + last_turn[len("tool\n"):].split("<|im_end|>")[0] + "."
    if "You can call the following tools" in prompt and last_turn.startswith("user\n"):
        return CALL_TEXT
    return "Hello!"


def assert_token_exact(segment, renderer, prompt_messages: int):
    """A recorded segment holds exactly the template's rendering of its messages (it ends on the
    policy's own tokens: the closing text after the last reply is absent), and its prompt (mask 0)
    is the rendering of its first ``prompt_messages`` messages with the generation prompt."""
    expected = renderer.conversation_ids(segment.messages, segment.tools)
    ids = list(segment.token_ids)
    assert expected[: len(ids)] == ids, (renderer.decode(expected), renderer.decode(ids))
    rest = expected[len(ids):]
    assert rest == renderer.closing[len(renderer.closing) - len(rest):]
    prompt = renderer.conversation_ids(segment.messages[:prompt_messages], segment.tools, add_generation_prompt=True)
    assert segment.prompt_length == len(prompt) and ids[: len(prompt)] == prompt
    assert set(segment.loss_mask[: len(prompt)]) == {0} and segment.loss_mask[len(prompt)] == 1


def generated_ids(segment):
    """The ids under mask 1, in order."""
    return [t for t, bit in zip(segment.token_ids, segment.loss_mask) if bit]


def assert_add_round_trip(trajectory, renderer):
    """An agent episode of the scripted ``add`` round trip (``reply_for``): one segment, the call,
    the tool result and the answer, token-exact, with the loss mask on exactly the two replies."""
    from rollforge.chat.render import token_fidelity_gap

    end = renderer.stop_token_ids[0]
    assert trajectory.error is None and trajectory.total_reward == 1.0, trajectory.error
    assert trajectory.turns == 2 and len(trajectory.segments) == 1
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert token_fidelity_gap(trajectory, renderer) is None
    assert generated_ids(trajectory) == renderer.encode(CALL_TEXT) + [end] + renderer.encode("The sum is 3.") + [end]
    runs = "".join(map(str, trajectory.loss_mask)).split("0")
    assert [len(r) for r in runs if r] == [len(renderer.encode(CALL_TEXT)) + 1, len(renderer.encode("The sum is 3.")) + 1]
