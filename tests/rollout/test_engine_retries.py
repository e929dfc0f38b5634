"""Infrastructure failures are run again (``RolloutConfig.infra_retries``); policy failures are not.

A scripted backend and small step-style environments inject each failure into one chosen episode;
the others must come out exactly as without it, in both scheduling modes."""

from __future__ import annotations

import asyncio
import logging

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import BackendError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Message, Sample

MODES = ["async", "lockstep"]


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


class Session(BaseSession):
    """Three turns of observations (reward 0.25 each); ``behave(turn)`` may raise first."""

    def __init__(self, behave):
        self.behave, self.turn = behave, 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        self.behave(self.turn)
        return Step(messages=(Message("user", f"observation {self.turn}"),), reward=0.25, terminated=self.turn == 3)


class Env(Environment):
    def __init__(self, behave=lambda turn: None):
        self.behave, self.opened = behave, 0

    def open(self, sample):
        self.opened += 1
        return Session(self.behave)


def samples(n: int = 4) -> list[Sample]:
    return [Sample(prompt=[{"role": "user", "content": f"Task number {i}."}]) for i in range(n)]


class FailingBackend(ScriptedBackend):
    """Answers "fine"; the requests of the episode whose prompt names ``task`` fail while ``fail(k)``
    holds (k: that episode's request count so far). Records (episode, seed) of every request."""

    def __init__(self, renderer, task: str, fail):
        super().__init__(lambda r: "fine", renderer, end_token_id=renderer.stop_token_ids[0])
        self.renderer, self.task, self.fail = renderer, task, fail
        self.requests: list[tuple[bool, int]] = []

    async def generate(self, prompt_ids, params):
        chosen = self.task in self.renderer.decode(prompt_ids)
        count = sum(1 for c, _ in self.requests if c)
        self.requests.append((chosen, params.seed))
        if chosen and self.fail(count):
            raise BackendError(f"request {count} of the chosen episode failed")
        return await super().generate(prompt_ids, params)


async def run(batch, env, backend, renderer, **config):
    return await asyncio.wait_for(arollout(batch, {"default": env}, backend, renderer, RolloutConfig(**config)), 30)


@pytest.mark.parametrize("mode", MODES)
async def test_a_backend_failure_is_run_again_with_the_same_seeds_and_completes(renderer, mode, caplog):
    # the chosen episode's second request (turn 2: in lockstep, after the wave's first barrier) fails once
    backend = FailingBackend(renderer, "Task number 1.", lambda k: k == 1)
    clean = await run(
        samples(), Env(), FailingBackend(renderer, "nobody", lambda k: False), renderer, mode=mode, concurrency=4
    )
    env = Env()
    with caplog.at_level(logging.WARNING, "rollforge.rollout.engine"):
        result = await run(samples(), env, backend, renderer, mode=mode, concurrency=4, infra_retries=2)
    assert [t.retries for t in result.trajectories] == [0, 1, 0, 0]
    assert all(t.terminated and t.error is None and t.outcome == "completed" for t in result.trajectories)
    assert env.opened == 5  # four episodes, one of them twice
    # the rerun starts over with the same seeds: turns 1, 2 (failed), then 1, 2, 3 again
    seeds = [seed for chosen, seed in backend.requests if chosen]
    assert len(seeds) == 5 and seeds[:2] == seeds[2:4] and len(set(seeds)) == 3
    assert [t.token_ids for t in result.trajectories] == [t.token_ids for t in clean.trajectories]
    assert [t.total_reward for t in result.trajectories] == [0.75] * 4
    assert (result.metrics["infra_retries"], result.metrics["infra_failures"]) == (1, 0)
    assert "episode 1 failed for infrastructure reasons (backend_error" in caplog.text and "retry 1 of 2" in caplog.text


@pytest.mark.parametrize("mode", MODES)
async def test_a_backend_that_always_fails_gives_up_after_the_retries_and_spares_the_batch(renderer, mode):
    backend = FailingBackend(renderer, "Task number 2.", lambda k: True)
    result = await run(samples(), Env(), backend, renderer, mode=mode, concurrency=4, infra_retries=2)
    failed = result.trajectories[2]
    assert failed.error.kind == "backend_error" and failed.outcome == "infra_failure" and failed.retries == 2
    assert sum(chosen for chosen, _ in backend.requests) == 3  # the first run and two reruns, one request each
    others = [t for i, t in enumerate(result.trajectories) if i != 2]
    assert all(t.terminated and t.retries == 0 and t.total_reward == 0.75 for t in others)
    assert (result.metrics["infra_retries"], result.metrics["infra_failures"]) == (2, 1)
    assert result.metrics["errors"] == {"backend_error": 1}


async def test_without_retries_nothing_is_run_again(renderer):
    backend = FailingBackend(renderer, "Task number 2.", lambda k: True)
    result = await run(samples(), Env(), backend, renderer)
    assert [t.outcome for t in result.trajectories] == ["completed", "completed", "infra_failure", "completed"]
    assert [t.retries for t in result.trajectories] == [0] * 4 and result.metrics["infra_retries"] == 0


@pytest.mark.parametrize("mode", MODES)
async def test_an_environment_that_raises_once_is_run_again(renderer, mode):
    raised = []

    def behave(turn):
        if turn == 2 and not raised:  # the first episode to reach turn 2 crashes there, once
            raised.append(turn)
            raise ConnectionError("simulator connection reset")

    env = Env(behave)
    result = await run(
        samples(3),
        env,
        FailingBackend(renderer, "nobody", lambda k: False),
        renderer,
        mode=mode,
        concurrency=3,
        infra_retries=1,
    )
    assert sorted(t.retries for t in result.trajectories) == [0, 0, 1] and env.opened == 4
    assert all(t.terminated and t.turns == 3 and t.total_reward == 0.75 for t in result.trajectories)
    assert result.metrics["infra_failures"] == 0


async def test_policy_failures_are_not_run_again(renderer, tiny_model_dir):
    # a conversation the chat template cannot render is a policy failure (template_error)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if 'FORBIDDEN' in m['content'] %}{{ raise_exception('cannot render it') }}"
        "{% endif %}{% endfor %}" + tokenizer.chat_template
    )
    strict = ChatRenderer(tokenizer, renderer.family)
    batch = [*samples(2), Sample(prompt=[{"role": "user", "content": "Task number 2. FORBIDDEN"}])]
    env = Env()
    backend = FailingBackend(strict, "nobody", lambda k: False)
    result = await run(batch, env, backend, strict, infra_retries=2, check_template=False)
    failed = result.trajectories[2]
    assert failed.error.kind == "template_error" and failed.outcome == "policy_failure" and failed.retries == 0
    assert env.opened == 3 and result.metrics["infra_retries"] == 0 and result.metrics["infra_failures"] == 0

    class Echo:
        def reset(self, **kwargs) -> None:
            return None

        def echo(self, text: str) -> str:
            """Echo the text.

            Args:
                text: What to echo.
            """
            return text

    # a malformed tool call is the model's too: counted, reported back, the episode completes
    bad_call = ScriptedBackend(
        lambda r: "<tool_call>\n{not json}\n</tool_call>" if r.call == 0 else "done",
        renderer,
        end_token_id=renderer.stop_token_ids[0],
    )
    result = await run(samples(1), FactoryEnvironment(Echo), bad_call, renderer, infra_retries=2)
    t = result.trajectories[0]
    assert t.outcome == "completed" and t.retries == 0 and [f.kind for f in t.failures] == ["tool_invalid_json"]
    assert bad_call.calls == 2
