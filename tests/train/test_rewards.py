"""Reward functions: signature, weights, None for 'does not apply', async, and failures."""

import asyncio
import os
from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import ConfigError
from rollforge.rollout.engine import arollout
from rollforge.train.config import RewardConfig
from rollforge.inputs.rewards import RewardFunction, compute_rewards, load_reward_functions, mean_or_none
from rollforge.types import Message, Sample, Trajectory


def _trajectory(index, task, reply, reward):
    return Trajectory(
        index=index,
        task_name=task,
        messages=(Message("user", "q"), Message("assistant", reply)),
        token_ids=(1, 2),
        loss_mask=(0, 1),
        logprobs=(None, -0.5),
        prompt_length=1,
        rewards=(reward,),
        total_reward=reward,
        turns=1,
        ending="terminated",
    )


SAMPLES = [
    Sample((Message("user", "q"),), "math", {"answer": "4"}),
    Sample((Message("user", "q"),), "game", {"answer": None}),
]
TRAJECTORIES = [_trajectory(0, "math", "4", 0.5), _trajectory(1, "game", "left", 1.0)]


def exact(prompts, completions, environments=None, answer=None, task_name=None, **_):
    return [float(c[-1]["content"] == a) if t == "math" else None for c, a, t in zip(completions, answer, task_name)]


async def length_penalty(prompts, completions, **_):
    await asyncio.sleep(0)
    return [-0.1 * len(c[-1]["content"]) for c in completions]


async def test_weighted_functions_add_to_the_environment_reward():
    functions = [RewardFunction("exact", exact, 2.0), RewardFunction("length", length_penalty, 1.0)]
    r = await compute_rewards(TRAJECTORIES, SAMPLES, functions, env_weight=0.5)
    # math: 0.5 * 0.5 + 2 * 1.0 - 0.1 * 1 = 2.15 ; game: 0.5 * 1.0 + (exact: None) - 0.1 * 4 = 0.1
    assert r.totals == pytest.approx([2.15, 0.1])
    assert r.per_function["exact"] == [1.0, None]
    assert mean_or_none(r.per_function["exact"]) == 1.0


async def test_a_function_that_never_applies_has_a_missing_mean_not_nan():
    r = await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("none", lambda p, c, **_: [None, None])])
    assert mean_or_none(r.per_function["none"]) is None
    assert r.totals == [0.5, 1.0]


async def test_a_raising_function_costs_its_signal_not_the_run():
    def broken(prompts, completions, **_):
        raise RuntimeError("verifier crashed")

    r = await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("broken", broken)])
    assert r.per_function["broken"] == [None, None]
    assert "verifier crashed" in r.errors["broken"]
    assert r.totals == [0.5, 1.0]


async def test_wrong_shapes_and_values_are_named():
    with pytest.raises(ConfigError, match="returned 1 values; expected a list of 2"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("short", lambda p, c, **_: [1.0])])
    with pytest.raises(ConfigError, match="returned NaN"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("nan", lambda p, c, **_: [float("nan"), 1])])
    with pytest.raises(ConfigError, match="returned 'x'"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [RewardFunction("text", lambda p, c, **_: ["x", 1])])


def test_functions_load_from_modules_and_files(tmp_path):
    (tmp_path / "my_rewards.py").write_text("def shout(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    loaded = load_reward_functions([RewardConfig(function=f"{tmp_path / 'my_rewards.py'}:shout", weight=0.5)])
    assert loaded[0].name == "shout" and loaded[0].weight == 0.5 and loaded[0].function([1], [2]) == [1.0]
    assert (
        load_reward_functions([RewardConfig(function="rollforge.inputs.rewards:mean_or_none")])[0].function([None])
        is None
    )
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_reward_functions([RewardConfig(function="rollforge.inputs.rewards:nope")])
    with pytest.raises(ConfigError, match="cannot import module"):
        load_reward_functions([RewardConfig(function="no_such_module_xyz:f")])


# -- plain functions are the contract (TRL style) ----------------------------------------------------


async def test_plain_sync_and_async_functions_are_reward_functions():
    def exact(prompts, completions, environments, answer, **kwargs):  # TRL's signature, no wrapper
        return [float(c[-1]["content"] == a) if a else None for c, a in zip(completions, answer)]

    async def short(completions, **kwargs):  # TRL's shortest form: keywords only
        return [1.0 if len(c[-1]["content"]) < 3 else 0.0 for c in completions]

    r = await compute_rewards(TRAJECTORIES, SAMPLES, [exact, short, RewardFunction("exact", exact, 3.0)])
    assert list(r.per_function) == ["exact", "short", "exact_2"]
    assert r.per_function["exact"] == [1.0, None] and r.per_function["short"] == [1.0, 0.0]
    # math: 0.5 + 1 + 1 + 3 * 1 = 5.5 ; game: 1.0 + 0 + 0 (exact: None twice) = 1.0
    assert r.totals == pytest.approx([5.5, 1.0]) and r.errors == {}


async def test_the_real_error_of_a_plain_function_is_reported_not_swallowed():
    def broken(prompts, completions, **kwargs):
        return [1.0 / 0 for _ in completions]

    r = await compute_rewards(TRAJECTORIES, SAMPLES, [broken])
    assert r.errors == {"broken": "ZeroDivisionError: float division by zero"}
    assert r.per_function["broken"] == [None, None]


async def test_a_function_that_cannot_take_the_arguments_is_named_before_it_runs():
    calls = []

    def no_kwargs(prompts, completions):
        calls.append(1)
        return [1.0, 1.0]

    with pytest.raises(
        ConfigError,
        match=r"reward function 'no_kwargs' cannot be called .*unexpected keyword argument "
        r"'environments'; give it a \*\*kwargs parameter",
    ):
        await compute_rewards(TRAJECTORIES, SAMPLES, [no_kwargs])
    assert calls == []
    with pytest.raises(ConfigError, match=r"a reward function must be a function .* got 3 \(int\)"):
        await compute_rewards(TRAJECTORIES, SAMPLES, [3])


# -- completions are exactly what was generated after the prompt --------------------------------------


class Counter:
    def reset(self, start: int = 0) -> str:
        self.total = start
        return f"The counter starts at {start}."

    def add(self, n: int) -> int:
        """Add to the counter.

        Args:
            n: How much to add.
        """
        self.total += n
        return {"total": self.total, "ok": True}  # a dict: rendered as JSON text


QWEN = Path(os.path.dirname(trl.__file__)) / "chat_templates" / "qwen2_5.jinja"


@pytest.mark.parametrize("template", ["tiny (ignores tools=)", "qwen2.5 (renders tools=)"])
async def test_completions_are_the_messages_generated_after_the_rendered_prompt(tiny_model_dir, template):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    if template.startswith("qwen"):
        tokenizer.chat_template = QWEN.read_text()
    renderer = ChatRenderer(tokenizer)
    assert renderer.supports_tools() == template.startswith("qwen")

    def script(request):
        tail = renderer.decode(request.prompt_ids[-40:])
        return "It is 3." if "total" in tail else '<tool_call>\n{"name": "add", "arguments": {"n": 3}}\n</tool_call>'

    samples = [
        Sample(prompt=[{"role": "user", "content": "Add three."}], row={"start": 0}),
        Sample(prompt=[{"role": "system", "content": "Be brief."}], row={"start": 1}),
    ]  # reset adds a user turn
    backend = ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0])
    result = await arollout(samples, {"default": FactoryEnvironment(Counter)}, backend, renderer)
    seen = {}

    def record(prompts, completions, **kwargs):
        seen["prompts"], seen["completions"] = prompts, completions
        return [0.0, 0.0]

    await compute_rewards(result.trajectories, samples, [record])
    assert seen["prompts"] == [
        [{"role": "user", "content": "Add three."}],
        [{"role": "system", "content": "Be brief."}],
    ]
    call = '<tool_call>\n{"name": "add", "arguments": {"n": 3}}\n</tool_call>'

    def completion(episode: int, total: int) -> list[dict]:
        call_id = f"call_{episode}_0_0"  # the family's deterministic id: the format carries none
        parsed = [{"id": call_id, "type": "function", "function": {"name": "add", "arguments": {"n": 3}}}]
        return [
            {"role": "assistant", "content": call, "tool_calls": parsed},
            {"role": "tool", "content": f'{{"total": {total}, "ok": true}}', "name": "add", "tool_call_id": call_id},
            {"role": "assistant", "content": "It is 3."},
        ]

    assert seen["completions"] == [completion(0, 3), completion(1, 4)]
