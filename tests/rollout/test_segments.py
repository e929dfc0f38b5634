"""Episodes on templates that rewrite history continue in segments; cut observations leave only
the text their ids hold."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.envs.factory import FactoryEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact
from rollforge.types import Message, Sample, Trajectory

# Written here in the manner of LFM2.5's template: past reasoning is dropped only from assistant
# messages that contain "</think>" and come before the last user message.
DROPS_CLOSED_THINKING = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last = loop.index0 %}"
    "{% endif %}{% endfor %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last and '</think>' in c %}{% set c = c.split('</think>')[-1] | trim %}"
    "{% endif %}{{ c }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def renderer_with(tokenizer, template):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return ChatRenderer(other)


class Guess(BaseSession):
    def __init__(self):
        self.turn = 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        return Step(messages=(Message("user", f"No ({self.turn})."),), reward=1.0, terminated=self.turn == 3)


class Game(Environment):
    def open(self, sample):
        return Guess()


async def play(renderer, reply, env=None, max_seq_len=4096):
    backend = RecordingBackend(ScriptedBackend(reply, renderer))
    config = RolloutConfig(max_turns=5, max_seq_len=max_seq_len, max_new_tokens=64)
    result = await arollout(
        [Sample(prompt=[{"role": "user", "content": "Guess."}])], {"default": env or Game()}, backend, renderer, config
    )
    return result.trajectories[0], backend.calls


@pytest.mark.parametrize("think, segments", [(False, 1), (True, 3)])
async def test_a_template_that_drops_closed_reasoning_is_never_accepted_and_then_diverges(tokenizer, think, segments):
    renderer = renderer_with(tokenizer, DROPS_CLOSED_THINKING)
    report = renderer.check_template([Message("user", "Guess.")])
    assert not report.incremental  # the probe has closed reasoning blocks
    reply = (lambda r: f"<think>\nhm {r.call}\n</think>\n\n{r.call}") if think else (lambda r: f"{r.call}")
    t, calls = await play(renderer, reply)
    assert t.terminated and t.turns == 3 and len(t.segments) == segments
    assert assert_token_exact([t], calls, renderer) == 3  # every generation continues its ids, in its segment
    for k, segment in enumerate(t.segments[1:], 1):
        prompt = renderer.decode(segment.token_ids[: segment.prompt_length])
        assert f"hm {k - 1}" not in prompt and prompt.endswith("<|im_start|>assistant\n")  # rewritten by the template
        assert list(segment.token_ids[: segment.prompt_length]) == renderer.conversation_ids(
            t.messages[: t.segments[k - 1].messages + 1], add_generation_prompt=True
        )
    assert t.token_ids == tuple(x for s in t.segments for x in s.token_ids)
    assert t.prompt_length == t.segments[0].prompt_length
    assert Trajectory.from_json(json.loads(json.dumps(t.to_json()))) == t


class OutOfTime(Guess):
    """``Guess``, but its last step is the environment's own limit (truncated), not a solved task."""

    async def step(self, conversation):
        step = await super().step(conversation)
        return replace(step, terminated=False, truncated=step.terminated)


class TimeUp(Environment):
    def open(self, sample):
        return OutOfTime()


async def test_an_episode_the_environment_truncates_on_a_diverging_template_ends_truncated(tokenizer):
    renderer = renderer_with(tokenizer, DROPS_CLOSED_THINKING)
    t, calls = await play(renderer, lambda r: f"<think>\nhm {r.call}\n</think>\n\n{r.call}", env=TimeUp())
    assert t.ending == "truncated" and t.turns == 3 and len(t.segments) == 3
    assert t.messages[-1] == Message("user", "No (3).")
    assert assert_token_exact([t], calls, renderer) == 3


async def test_a_new_segment_that_does_not_fit_ends_the_episode_truncated(tokenizer):
    renderer = renderer_with(tokenizer, DROPS_CLOSED_THINKING)
    t, _ = await play(renderer, lambda r: "<think>\nlong thought " * 4 + "\n</think>\n\n1", max_seq_len=150)
    assert t.truncated and len(t.segments) == 1 and len(t.token_ids) <= 150
    assert t.messages[-1].role == "assistant"  # the user turn that did not fit is not kept
    assert token_fidelity_gap(t, renderer) is None


class Huge:
    def reset(self, **kwargs) -> None:
        pass

    def read(self) -> str:
        """Read the whole file."""
        return "line of the file\n" * 150_000  # 2.4 MB


async def test_a_cut_observation_keeps_only_the_text_its_ids_hold(tokenizer):
    renderer = ChatRenderer(tokenizer)
    call = '<tool_call>\n{"name": "read", "arguments": {}}\n</tool_call>'
    t, _ = await play(renderer, lambda r: call, env=FactoryEnvironment(Huge), max_seq_len=600)
    assert t.truncated and len(t.token_ids) == 600
    result = t.messages[-1]
    assert result.role == "tool" and 0 < len(result.content) < 2_000
    assert result.content.startswith("line of the file\nline")
    assert renderer.decode(t.token_ids).endswith(result.content)  # the message is what the ids hold
    assert token_fidelity_gap(t, renderer) is None
