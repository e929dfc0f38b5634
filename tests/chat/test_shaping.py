"""Message shaping for templates that refuse a role: the system text moves into the first user
message, and nothing else of that message is lost (its images: a Gemma-2-style template under a
vision processor)."""

from __future__ import annotations

from rollforge.chat.shaping import system_in_first_user
from rollforge.types import Message


def test_the_system_text_opens_the_first_user_message_which_keeps_its_images():
    picture = b"\x89PNG\r\n\x1a\n not decoded here"
    shaped = system_in_first_user(
        (
            Message("system", "Be brief."),
            Message("user", "What is shown?", images=(picture,)),
            Message("assistant", "A"),
        )
    )
    assert [m.role for m in shaped] == ["user", "assistant"]
    assert shaped[0].content == "Be brief.\n\nWhat is shown?" and shaped[0].images == (picture,)


def test_without_a_user_message_after_it_the_system_text_becomes_one():
    assert system_in_first_user((Message("system", "Be brief."),)) == (Message("user", "Be brief."),)
    alone = (Message("user", "hi", images=(b"x",)),)
    assert system_in_first_user(alone) is alone
