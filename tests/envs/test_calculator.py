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
from rollforge.recipes.sft_data import expert_demonstrations
from rollforge.rollout.config import RolloutConfig
from rollforge.types import Message, ToolCall

from test_library import call, play


def test_samples_are_seeded_and_their_row_holds_the_result():
    first = calculator.samples(60, 4)
    assert first == calculator.samples(60, 4) and first != calculator.samples(60, 5)
    assert Counter(s.row["op"] for s in first).keys() == {"plus", "minus", "times"}
    for s in first:
        a, word, b = re.fullmatch(r"What is (\d+) (\w+) (\d+)\?", s.prompt[-1].content).groups()
        assert (
            100 <= int(a) <= 999
            and 100 <= int(b) <= 999
            and (int(a), int(b), word) == (s.row["a"], s.row["b"], s.row["op"])
        )
        assert s.row["result"] == {"plus": int(a) + int(b), "minus": int(a) - int(b), "times": int(a) * int(b)}[word]
        assert s.task_name == "calculator" and s.prompt[0].role == "system"
    assert all(0 <= s.row["a"] <= 9 for s in calculator.samples(10, 0, digits=1))
    with pytest.raises(ConfigError, match="calculator digits must be a positive int, got 0"):
        calculator.samples(1, 0, digits=0)


def test_one_computation_then_the_answer_ends_the_episode_and_is_graded():
    env = CalculatorEnv()
    env.reset(result=7)
    assert not env.done and env.get_reward() == 0.0  # no call yet
    assert env.add(3, 4) == "7" and not env.done and env.get_reward() == 0.0  # computed, not answered
    assert env.multiply(3, 4) == calculator.ONE_COMPUTATION  # the first computation stands
    assert env.answer(7) == "Recorded." and env.done and env.get_reward() == 1.0
    for tool, value in ((env.subtract, "-1"), (env.multiply, "12")):
        env.reset(result=7)
        assert tool(3, 4) == value and env.answer(int(value)) and env.done and env.get_reward() == 0.0
    env.reset(result=7)
    env.answer(7)
    assert env.get_reward() == 1.0  # a right guess without computing counts: the reward is the answer


def test_after_the_answer_every_tool_refuses_and_changes_nothing():
    """TRL ignores ``done`` (every call of a message runs, then one more turn): the class itself holds the episode."""
    env = CalculatorEnv()
    env.reset(result=7)
    assert env.answer(8) == "Recorded." and env.done
    assert env.answer(7) == env.add(3, 4) == env.multiply(1, 7) == calculator.EPISODE_OVER
    assert env.get_reward() == 0.0  # the first answer stands


def compute_then_answer(tool: str, a: int, b: int):
    """A policy: ``tool(a, b)``, then ``answer`` with the value it returned."""
    return lambda last: call(tool, a=a, b=b) if "?" in last else call("answer", value=int(last))


@pytest.mark.parametrize(("tool", "reward"), [("multiply", 1.0), ("add", 0.0), ("subtract", 0.0)])
async def test_only_the_tool_the_question_names_solves_it(tool, reward):
    sample = next(s for s in calculator.samples(20, 1) if s.row["op"] == "times")
    a, b = sample.row["a"], sample.row["b"]
    steps, final = await play(get_env_spec("calculator").build(), sample, compute_then_answer(tool, a, b))
    assert len(steps) == 2 and not steps[0].terminated and steps[1].terminated and final == reward
    value = {"multiply": a * b, "add": a + b, "subtract": a - b}[tool]
    assert [(m.role, m.content) for m in steps[0].messages] == [("tool", str(value))]


async def test_wrong_operands_or_no_call_score_zero():
    sample = next(s for s in calculator.samples(20, 1) if s.row["op"] == "plus")
    steps, final = await play(
        get_env_spec("calculator").build(), sample, compute_then_answer("add", sample.row["a"], 1)
    )
    assert steps[-1].terminated and final == 0.0
    steps, final = await play(
        get_env_spec("calculator").build(), sample, lambda _: Message("assistant", str(sample.row["result"]))
    )
    assert steps[0].terminated and final == 0.0  # the answer must come through answer


async def test_tool_schemas_name_the_operations():
    sample = calculator.samples(1, 0)[0]
    reset = await get_env_spec("calculator").build().open(sample).reset(sample)
    assert [t["function"]["name"] for t in reset.tools] == ["add", "subtract", "multiply", "answer"]
    assert reset.tools[2]["function"]["description"] == "Return a * b."
    assert reset.tools[0]["function"]["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "The first number."},
        "b": {"type": "integer", "description": "The second number."},
    }


def test_expert_calls_a_random_operation_on_the_operands():
    question = [Message("system", calculator.SYSTEM_PROMPT), Message("user", "What is 120 times 30?")]
    parser = get_parser()
    first = parser.parse(calculator.expert(question, parser))[0]
    assert first.name in {"add", "subtract", "multiply"} and first.arguments == {"a": 120, "b": 30}
    answered = [*question, Message("assistant", "..."), Message("tool", "3600")]
    assert parser.parse(calculator.expert(answered, parser))[0] == ToolCall("answer", {"value": 3600})
    assert calculator.expert(question, parser) == calculator.expert(question, parser)  # seeded by the question
    chosen = Counter(
        parser.parse(calculator.expert([Message("user", s.prompt[-1].content)], parser))[0].name
        for s in calculator.samples(90, 0)
    )
    assert set(chosen) == {"add", "subtract", "multiply"} and min(chosen.values()) >= 20  # no tool is favoured


def test_expert_demonstrations_have_the_format_and_solve_when_the_tool_fits(tiny_model_dir):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    config = RolloutConfig(max_turns=2, max_seq_len=4096)
    result = asyncio.run(expert_demonstrations("calculator", 24, renderer, config, seed=3))
    samples = calculator.samples(24, 3)
    parser = get_parser()
    for trajectory, sample in zip(result.trajectories, samples):
        assert trajectory.terminated and trajectory.turns == 2 and trajectory.error is None and not trajectory.failures
        first, second = (parser.parse(m.content)[0] for m in trajectory.messages if m.role == "assistant")
        assert second.name == "answer" and trajectory.total_reward == (
            1.0 if first.name == calculator.OPERATIONS[sample.row["op"]] else 0.0
        )
    assert 0 < sum(t.total_reward for t in result.trajectories) < 24


def test_check_env_passes():
    assert check_env(get_env_spec("calculator"), steps=2).name == "calculator"


async def test_operations_option_asks_only_those_and_offers_only_their_tools():
    two = calculator.samples(40, 2, operations=["times", "plus"])
    assert Counter(s.row["op"] for s in two).keys() == {"plus", "times"}
    assert two[0].prompt[0].content == "Compute with one tool call (add or multiply), then call answer with the result."
    for op, tool in (("times", "multiply"), ("plus", "add")):
        sample = next(s for s in two if s.row["op"] == op)
        env = get_env_spec("calculator").build()
        reset = await env.open(sample).reset(sample)
        assert [t["function"]["name"] for t in reset.tools] == ["add", "multiply", "answer"]
        assert [t["function"]["name"] for t in env.offered_tools(sample)] == ["add", "multiply", "answer"]
        steps, final = await play(env, sample, compute_then_answer(tool, sample.row["a"], sample.row["b"]))
        assert steps[-1].terminated and final == 1.0
    sample = two[0]
    steps, _ = await play(get_env_spec("calculator").build(), sample, lambda _: call("subtract", a=1, b=2))
    assert "unknown tool 'subtract'" in steps[0].messages[0].content  # not offered


@pytest.mark.parametrize("bad", [(), ("plus", "plus"), ("plus", "divide"), "plus"])
def test_bad_operations_name_the_value(bad):
    with pytest.raises(
        ConfigError, match=r"calculator operations must be distinct words among plus, minus, times, got "
    ):
        calculator.samples(1, 0, operations=bad)


def test_expert_chooses_uniformly_among_the_offered_tools_only():
    parser = get_parser()
    chosen = Counter(
        (s.row["op"], parser.parse(calculator.expert(list(s.prompt), parser))[0].name)
        for s in calculator.samples(120, 0, operations=("plus", "times"))
    )
    assert {tool for _, tool in chosen} == {"add", "multiply"}
    for op in ("plus", "times"):  # both tools demonstrated for both question kinds, near 50/50
        assert min(chosen[(op, "add")], chosen[(op, "multiply")]) >= 20


def test_two_operation_demonstrations_solve_about_half(tiny_model_dir):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    config = RolloutConfig(max_turns=2, max_seq_len=4096)
    result = asyncio.run(
        expert_demonstrations("calculator", 32, renderer, config, seed=3, options={"operations": ["plus", "times"]})
    )
    assert all(t.terminated and t.error is None and not t.failures for t in result.trajectories)
    assert 8 <= sum(t.total_reward for t in result.trajectories) <= 24


def test_balanced_questions_give_every_operation_and_tool_pair_equally_often():
    parser = get_parser()
    for seed in (0, 1, 2):
        questions = calculator.samples(32, seed, operations=["plus", "times"], balanced=True)
        chosen = Counter(
            (s.row["op"], parser.parse(calculator.expert(list(s.prompt), parser))[0].name) for s in questions
        )
        assert chosen == {(op, tool): 8 for op in ("plus", "times") for tool in ("add", "multiply")}
        assert questions == calculator.samples(32, seed, operations=["plus", "times"], balanced=True)
    blocks = calculator.samples(40, 5, operations=["plus", "times"], balanced=True)
    for start in range(0, 40, 4):  # every aligned block of 4 asks each operation twice
        assert Counter(s.row["op"] for s in blocks[start : start + 4]) == {"plus": 2, "times": 2}
    three = Counter(s.row["op"] for s in calculator.samples(9, 0, balanced=True))
    assert three == {"plus": 3, "minus": 3, "times": 3}
