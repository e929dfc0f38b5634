"""``calculator``: its questions, tools, rewards, and an expert that teaches the format, not the choice."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest

from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import get_parser
from rollforge.envs.check import check_env
from rollforge.envs.library import calculator, get_env_spec
from rollforge.envs.library.calculator import CalculatorEnv
from rollforge.errors import ConfigError
from rollforge.models import load_tokenizer
from rollforge.rollout.config import RolloutConfig
from rollforge.train.sft_data import expert_demonstrations
from rollforge.types import Message

from test_library import call, play


def test_samples_are_seeded_and_their_row_holds_the_result():
    first = calculator.samples(60, 4)
    assert first == calculator.samples(60, 4) and first != calculator.samples(60, 5)
    assert Counter(s.row["op"] for s in first).keys() == {"plus", "minus", "times"}
    for s in first:
        a, word, b = re.fullmatch(r"What is (\d+) (\w+) (\d+)\?", s.prompt[-1].content).groups()
        assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999 and (int(a), int(b), word) == (s.row["a"], s.row["b"], s.row["op"])
        assert s.row["result"] == {"plus": int(a) + int(b), "minus": int(a) - int(b), "times": int(a) * int(b)}[word]
        assert s.task_name == "calculator" and s.prompt[0].role == "system"
    assert all(0 <= s.row["a"] <= 9 for s in calculator.samples(10, 0, digits=1))
    with pytest.raises(ConfigError, match="calculator digits must be a positive int, got 0"):
        calculator.samples(1, 0, digits=0)


def test_tools_compute_and_answer_ends_the_episode():
    env = CalculatorEnv()
    env.reset(result=7)
    assert (env.add(3, 4), env.subtract(3, 4), env.multiply(3, 4)) == ("7", "-1", "12")
    assert not env.done and env.get_reward() == 0.0  # no answer yet
    assert env.answer(7) == "Submitted." and env.done and env.get_reward() == 1.0
    env.reset(result=7)
    env.answer(12)
    assert env.done and env.get_reward() == 0.0


@pytest.mark.parametrize(("tool", "reward"), [("multiply", 1.0), ("add", 0.0), ("subtract", 0.0)])
async def test_the_right_tool_then_its_result_solves_the_question(tool, reward):
    sample = next(s for s in calculator.samples(20, 1) if s.row["op"] == "times")
    a, b = sample.row["a"], sample.row["b"]
    replies = iter([call(tool, a=a, b=b)])
    steps, final = await play(get_env_spec("calculator").build(), sample,
                              lambda last: next(replies, None) or call("answer", value=int(last)))
    assert [st.terminated for st in steps] == [False, True] and final == reward
    assert steps[0].messages[0].role == "tool" and int(steps[0].messages[0].content) == {"multiply": a * b, "add": a + b, "subtract": a - b}[tool]


async def test_an_answer_without_a_call_or_no_answer_at_all():
    sample = calculator.samples(1, 2)[0]
    steps, final = await play(get_env_spec("calculator").build(), sample, lambda _: call("answer", value=sample.row["result"]))
    assert len(steps) == 1 and steps[0].terminated and final == 1.0  # the answer is what is graded
    steps, final = await play(get_env_spec("calculator").build(), sample, lambda _: Message("assistant", "About 500."))
    assert steps[0].terminated and final == 0.0


async def test_tool_schemas_name_the_operations_and_answer():
    sample = calculator.samples(1, 0)[0]
    reset = await get_env_spec("calculator").build().open(sample).reset(sample)
    assert [t["function"]["name"] for t in reset.tools] == ["add", "subtract", "multiply", "answer"]  # in class order
    assert reset.tools[0]["function"]["parameters"]["properties"]["a"]["type"] == "integer"


def test_expert_calls_a_random_operation_then_answers_its_result():
    question = [Message("system", calculator.SYSTEM_PROMPT), Message("user", "What is 120 times 30?")]
    parser = get_parser()
    first = parser.parse(calculator.expert(question, parser))[0]
    assert first.name in {"add", "subtract", "multiply"} and first.arguments == {"a": 120, "b": 30}
    assert calculator.expert(question, parser) == calculator.expert(question, parser)  # seeded by the question
    after = [*question, Message("assistant", "..."), Message("tool", "150")]
    assert parser.parse(calculator.expert(after, parser))[0].arguments == {"value": 150}
    chosen = Counter(parser.parse(calculator.expert([Message("user", s.prompt[-1].content)], parser))[0].name
                     for s in calculator.samples(90, 0))
    assert set(chosen) == {"add", "subtract", "multiply"} and min(chosen.values()) >= 20  # no tool is favoured


def test_expert_demonstrations_have_the_format_and_solve_when_the_tool_fits(tiny_model_dir):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    config = RolloutConfig(max_turns=2, max_seq_len=4096)
    result = asyncio.run(expert_demonstrations("calculator", 24, renderer, config, seed=3))
    samples = calculator.samples(24, 3)
    parser = get_parser()
    for trajectory, sample in zip(result.trajectories, samples):
        assert trajectory.terminated and trajectory.turns == 2 and trajectory.error is None and not trajectory.failures
        first = parser.parse(next(m.content for m in trajectory.messages if m.role == "assistant"))[0]
        assert trajectory.total_reward == (1.0 if first.name == calculator.OPERATIONS[sample.row["op"]] else 0.0)
    assert 0 < sum(t.total_reward for t in result.trajectories) < 24


def test_check_env_passes():
    assert check_env(get_env_spec("calculator"), steps=2).name == "calculator"
