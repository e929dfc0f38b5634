"""Checked once: a training run checks its prompts (their tasks, environments and routes, their
lengths with their environments' tools, the chat template) before the model loads, and its steps'
rollouts do not check them again: a step passes its samples as a ``CheckedBatch`` of the run's
``CheckedPrompts``. A plain ``arollout`` still checks everything on every call, and a batch whose
check does not cover the rollout (a sample it never saw, another renderer, a tighter
``max_seq_len``) is checked again. Counted on the real check functions."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat import template_check
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.errors import ConfigError
from rollforge.recipes.launch import train
from rollforge.rollout import checks, engine
from rollforge.rollout.checks import check_prompts
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample

PROMPT_CHECKS = ("check_tasks", "check_environments", "check_routes", "check_prompt_lengths", "check_template")


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Calls of each check (``check_template``: the template check itself, under the renderer's
    cache), of the backend check and of ``check_rollout`` (one per rollout)."""
    counts: Counter = Counter()

    def count(module, name: str, label: str) -> None:
        original = getattr(module, name)

        def counting(*args, **kwargs):
            counts[label] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)

    for name in (*PROMPT_CHECKS[:-1], "check_backend"):
        count(checks, name, name)
    count(template_check, "check_template", "check_template")
    count(engine, "check_rollout", "rollouts")
    return counts


@pytest.mark.parametrize("staleness", [0, 1], ids=["sync", "async"])
def test_a_two_step_run_checks_its_prompts_once(tiny_config, counted, staleness):
    config = tiny_config(
        "steps=2",
        "eval_episodes=0",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        f"algorithm.max_staleness={staleness}",
    )
    train(config, console=False)
    assert counted["rollouts"] == 2  # one rollout per step
    assert {name: counted[name] for name in PROMPT_CHECKS} == dict.fromkeys(PROMPT_CHECKS, 1)
    assert counted["check_backend"] == 2  # the backend a rollout is given (async: a versioned one), every call


def test_held_out_evaluations_do_not_check_their_prompts_again(tiny_config, counted):
    config = tiny_config(
        "steps=2", "eval_episodes=2", "eval_every=1", "algorithm.batch_size=2", "algorithm.group_size=2"
    )
    train(config, console=False)
    assert counted["rollouts"] == 2 + 3  # two steps; evaluations before, after step 1 and after
    # the training prompts and the held-out prompts, each checked once before the model loaded
    assert {name: counted[name] for name in PROMPT_CHECKS[:-1]} == dict.fromkeys(PROMPT_CHECKS[:-1], 2)


class OneTurn(Environment):
    def open(self, sample):
        return Answered()


class Answered(BaseSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        return Step(reward=1.0, terminated=True)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def scripted(renderer):
    return ScriptedBackend(lambda request: "a", renderer, end_token_id=renderer.stop_token_ids[0])


def words(n: int) -> Sample:
    return Sample(prompt=[{"role": "user", "content": "word " * n}])


async def test_a_plain_rollout_checks_every_call_and_refuses_a_prompt_too_long(renderer, counted):
    envs, backend = {"default": OneTurn()}, scripted(renderer)
    for _ in range(2):
        await arollout([words(3)], envs, backend, renderer, RolloutConfig(max_seq_len=64))
    assert {name: counted[name] for name in PROMPT_CHECKS} == dict.fromkeys(PROMPT_CHECKS, 2)
    with pytest.raises(ConfigError) as refused:
        await arollout([words(100)], envs, backend, renderer, RolloutConfig(max_seq_len=50))
    assert re.fullmatch(
        r"max_seq_len=50 leaves no room to generate: prompt 1 is already \d+ tokens; "
        r"raise max_seq_len or shorten the prompts",
        str(refused.value),
    ), refused.value
    assert backend.calls == 2  # nothing generated for the refused prompt


async def test_a_batch_its_check_does_not_cover_is_checked_again(renderer, counted):
    envs, backend = {"default": OneTurn()}, scripted(renderer)
    short, long = words(3), words(30)
    need = len(renderer.prompt_ids(long.prompt)) + len(renderer.generation_prompt)  # the long prompt's length
    config = RolloutConfig(max_seq_len=need + 8)
    checked = check_prompts([short, long], envs, renderer, config)
    await arollout(checked.batch([long, short, long]), envs, backend, renderer, config)
    assert counted["check_prompt_lengths"] == 1  # the check's own: the rollout it covers checks nothing again
    await arollout(checked.batch([words(3)]), envs, backend, renderer, config)  # the same text, not one of them
    await arollout(checked.batch([short]), envs, backend, ChatRenderer(renderer.tokenizer), config)
    assert counted["check_prompt_lengths"] == 3
    with pytest.raises(ConfigError, match=rf"^max_seq_len={need} leaves no room to generate: prompt 1 is already"):
        await arollout(checked.batch([long]), envs, backend, renderer, RolloutConfig(max_seq_len=need))
    assert counted["rollouts"] == 4 and backend.calls == 5
