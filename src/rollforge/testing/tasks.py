"""A task the tiny model can learn: ``FirstCharacter``, a single-turn step-style environment, and
``first_character_rows``, its prompts. The GRPO tests, the async-training benchmark and the
quick-start configs (``rollforge.testing:FirstCharacter``) train on it."""

from __future__ import annotations

#: The two kinds of request of ``FirstCharacter`` and their prompts.
FIRST_CHARACTER_KINDS = {"digit": "Reply with a digit.", "upper": "Reply with a capital letter."}


class FirstCharacter:
    """A single-turn, step-style task that the tiny model can learn in a few dozen GRPO steps.

    The reward is 1.0 when the reply's first character is of the kind the prompt asks for (a
    digit, or a capital letter; ``metadata["kind"]``). A random model almost never does either,
    and a policy that ignores the prompt gets at most half: above 0.9 means it reads the prompt.
    """

    def step(self, message_logs, metadata):
        from ..envs.stepwise import StepwiseReturn

        rewards = []
        for log, info in zip(message_logs, metadata):
            first = log[-1]["content"][:1]
            ok = first.isdigit() if info["kind"] == "digit" else (first.isalpha() and first.isupper())
            rewards.append(1.0 if ok else 0.0)
        return StepwiseReturn.final(rewards, metadata)


def first_character_rows(n: int) -> list[dict]:
    """``n`` prompt rows for ``FirstCharacter``, alternating kinds, each with an ``id`` column."""
    kinds = list(FIRST_CHARACTER_KINDS)
    return [
        {"prompt": f"{FIRST_CHARACTER_KINDS[kinds[i % 2]]} ({i})", "metadata": {"kind": kinds[i % 2]}, "id": i}
        for i in range(n)
    ]
