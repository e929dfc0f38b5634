"""rollforge.testing, the helpers the tests and benchmarks share: its exported names, the recording
backend, the token-exactness checks (they pass on a faithful rollout and fail on a tampered one),
the tiny tokenizer, and the bounded wait."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading

import pytest

import rollforge.testing
from rollforge.backends.base import Backend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import (
    RecordingBackend,
    assert_replies_exact,
    assert_token_exact,
    free_port,
    make_tokenizer,
    tokenizer_or_tiny,
    wait_until,
)
from rollforge.types import Message, Sample


def test_every_exported_name_is_public_and_defined():
    assert sorted(rollforge.testing.__all__) == rollforge.testing.__all__
    for name in rollforge.testing.__all__:
        assert not name.startswith("_") and hasattr(rollforge.testing, name), name


class GoOn(BaseSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        return Step(messages=(Message("user", "Go on."),))


class Conversation(Environment):
    def open(self, sample):
        return GoOn()


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(make_tokenizer())


def rollout(renderer, episodes=3, turns=2):
    scripted = ScriptedBackend(
        lambda request: f"reply {request.call}", renderer.tokenizer, end_token_id=renderer.stop_token_ids[0]
    )
    recorder = RecordingBackend(scripted)
    samples = [Sample(prompt=[{"role": "user", "content": f"Talk ({i})."}]) for i in range(episodes)]
    config = RolloutConfig(max_turns=turns, max_new_tokens=8, concurrency=episodes)
    result = asyncio.run(arollout(samples, {"default": Conversation()}, recorder, renderer, config))
    return result, recorder, scripted


def test_the_recording_backend_keeps_every_request_with_its_episode(renderer):
    result, recorder, scripted = rollout(renderer)
    assert isinstance(recorder, Backend) and not recorder.syncs_weights
    assert recorder.shares_model(object()) is False and recorder.supports_sleep is False
    assert [t.error for t in result.trajectories] == [None] * 3
    episodes = recorder.per_episode()
    assert [len(requests) for requests in episodes] == [2, 2, 2]  # two turns each
    for first, second in episodes:
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids  # the same conversation, grown
        assert (
            second.prompt_ids[len(first.prompt_ids) :][: len(first.completion.token_ids)] == first.completion.token_ids
        )
    calls = sorted(
        int(renderer.tokenizer.decode(r.completion.token_ids[:-1]).split()[-1])
        for requests in episodes
        for r in requests
    )
    assert calls == list(range(6))  # every request the backend served was recorded once
    assert recorder.calls == [(r.prompt_ids, r.completion) for r in recorder.requests]
    asyncio.run(recorder.close())
    assert not scripted._closed  # whoever opened the wrapped backend closes it


def test_token_exactness_holds_for_a_rollout_and_fails_when_a_call_is_altered(renderer):
    result, recorder, _ = rollout(renderer)
    assert assert_token_exact(result.trajectories, recorder.calls, renderer) == 6
    prompt, completion = recorder.calls[0]
    other_logprobs = dataclasses.replace(completion, logprobs=tuple(lp - 1.0 for lp in completion.logprobs))
    with pytest.raises(AssertionError):  # the trajectory does not keep the backend's logprobs for it
        assert_token_exact(result.trajectories, [(prompt, other_logprobs), *recorder.calls[1:]], renderer)
    others = [t for t in result.trajectories if t.token_ids[: len(prompt)] != prompt]
    theirs = [call for call in recorder.calls if call[0][: len(prompt)] != prompt]
    assert len(others) == 2 and len(theirs) == 4
    with pytest.raises(AssertionError, match="1 completions belong to no trajectory"):
        assert_token_exact(others, [recorder.calls[0], *theirs], renderer)


def test_replies_exactness_names_what_the_mask_covers(renderer):
    result, recorder, _ = rollout(renderer, episodes=1)
    (t,) = result.trajectories
    replies = [renderer.tokenizer.decode(c.token_ids[:-1]) for _, c in recorder.calls]
    assert_replies_exact(t, renderer, replies)
    with pytest.raises(AssertionError):
        assert_replies_exact(t, renderer, replies[:1])


def test_the_tiny_tokenizer_is_the_one_the_tiny_model_saves(tiny_model_dir):
    text = "Hello <|im_start|>user\nWhat is 12 + 30?<|im_end|> naïve"
    saved, built = tokenizer_or_tiny(tiny_model_dir), tokenizer_or_tiny(None)
    assert saved.encode(text) == built.encode(text) and len(saved) == len(built) == 640
    assert saved.chat_template == built.chat_template


def test_wait_until_returns_whether_the_condition_came_to_hold():
    flag = threading.Event()
    threading.Timer(0.01, flag.set).start()
    assert wait_until(flag.is_set)
    assert wait_until(lambda: False, timeout=0.05) is False


def test_a_free_port_can_be_bound():
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
