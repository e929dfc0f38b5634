"""Helpers shared by the gateway tests (a module of its own: ``conftest`` names collide across
test directories). The token-exactness checks they share with other tests are in
``rollforge.testing``."""

from __future__ import annotations

from rollforge.chat.render import token_fidelity_gap
from rollforge.testing import generated_ids

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def reply_for(prompt: str) -> str:
    """The scripted model: calls ``add`` when tools are offered and no result came back yet,
    answers with the result when one did, else greets."""
    last_turn = prompt.rsplit("<|im_start|>", 2)[-2]
    if last_turn.startswith("tool\n"):
        return "The sum is " + last_turn[len("tool\n") :].split("<|im_end|>")[0] + "."
    if "You can call the following tools" in prompt and last_turn.startswith("user\n"):
        return CALL_TEXT
    return "Hello!"


def assert_add_round_trip(trajectory, renderer):
    """An agent episode of the scripted ``add`` round trip (``reply_for``): one segment, the call,
    the tool result and the answer, token-exact, with the loss mask on exactly the two replies."""
    end = renderer.stop_token_ids[0]
    assert trajectory.error is None and trajectory.total_reward == 1.0, trajectory.error
    assert trajectory.turns == 2 and len(trajectory.segments) == 1
    assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert token_fidelity_gap(trajectory, renderer) is None
    assert generated_ids(trajectory) == renderer.encode(CALL_TEXT) + [end] + renderer.encode("The sum is 3.") + [end]
    runs = "".join(map(str, trajectory.loss_mask)).split("0")
    assert [len(r) for r in runs if r] == [
        len(renderer.encode(CALL_TEXT)) + 1,
        len(renderer.encode("The sum is 3.")) + 1,
    ]
