"""The token ledger: ids, mask, logprobs and versions laid out per segment, by hand."""

from rollforge.rollout.ledger import Ledger
from rollforge.types import Message, Trajectory

SYSTEM, USER = Message("system", "s"), Message("user", "u")
SAID, REWRITTEN = Message("assistant", "said"), Message("assistant", "Calling tools: [...]")


def test_one_segment_is_laid_out_as_plain_fields():
    ledger = Ledger()
    ledger.begin([1, 2])  # prompt
    ledger.extend([3])  # generation prompt
    ledger.extend([4, 5], (-0.5, -0.25), version=7)
    fields = ledger.fields([SYSTEM, USER, SAID])
    assert fields == {
        "token_ids": (1, 2, 3, 4, 5),
        "loss_mask": (0, 0, 0, 1, 1),
        "logprobs": (None, None, None, -0.5, -0.25),
        "prompt_length": 2,
        "versions": (7, 7),
    }


def test_a_segment_whose_messages_were_rewritten_keeps_them():
    ledger = Ledger()
    ledger.begin([1, 2, 3])
    ledger.extend([4], (-1.0,))
    ledger.close([SYSTEM, USER, SAID])  # the agent sends SAID back as REWRITTEN: a new segment
    ledger.begin([1, 2, 3, 9, 9, 3])
    ledger.extend([5], (-2.0,))
    messages = [SYSTEM, USER, REWRITTEN, Message("user", "observation"), SAID]
    fields = ledger.fields(messages)
    first, second = fields["segments"]
    assert (first.token_ids, first.messages, first.history) == ((1, 2, 3, 4), 3, (SYSTEM, USER, SAID))
    assert (second.token_ids, second.prompt_length, second.messages, second.history) == (
        (1, 2, 3, 9, 9, 3, 5),
        6,
        5,
        (),
    )
    assert (
        fields["token_ids"] == (1, 2, 3, 4, 1, 2, 3, 9, 9, 3, 5)
        and fields["prompt_length"] == 3
        and fields["versions"] == ()
    )
    trajectory = Trajectory(
        index=0,
        task_name="t",
        messages=tuple(messages),
        rewards=(0.0, 1.0),
        total_reward=1.0,
        turns=2,
        ending="terminated",
        **fields,
    )
    assert Trajectory.from_json(trajectory.to_json()).segments == trajectory.segments


def test_a_segment_whose_messages_are_the_conversations_first_keeps_none():
    ledger = Ledger()
    ledger.begin([1])
    ledger.extend([2], (-1.0,))
    ledger.close([USER, SAID])
    ledger.begin([1, 2, 3])
    first, _ = ledger.fields([USER, SAID, USER])["segments"]
    assert first.messages == 2 and first.history == ()
