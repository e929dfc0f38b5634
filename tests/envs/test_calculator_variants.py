"""``calculator``'s variants: chains of operations (``computations``), questions that start from a number
(``continuation``) and closing episodes (``closing``),
and the default's questions unchanged by them (the quickstart's measured runs read those)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import get_parser
from rollforge.envs.library import calculator, get_env_spec
from rollforge.errors import ConfigError
from rollforge.models import load_tokenizer
from rollforge.recipes.sft_data import expert_demonstrations
from rollforge.rollout.config import RolloutConfig
from rollforge.types import Message

from test_library import call, play

PLUS_TIMES = ("plus", "times")


def test_the_quickstarts_questions_are_unchanged_by_the_variants():
    first = calculator.samples(4, 0, operations=PLUS_TIMES, balanced=True)
    assert [s.prompt[1].content for s in first] == [
        "What is 365 times 623?",
        "What is 902 plus 949?",
        "What is 410 plus 588?",
        "What is 242 times 388?",
    ]
    assert (
        first[0].prompt[0].content == "Compute with one tool call (add or multiply), then call answer with the result."
    )
    assert set(first[0].row) == {"a", "b", "op", "result", "environment"}  # no `then`, no `closing`


def test_a_chain_is_read_left_to_right_and_its_row_holds_every_operation():
    for s in calculator.samples(40, 1, operations=PLUS_TIMES, computations=3, digits=2):
        a, b = s.row["a"], s.row["b"]
        value = a + b if s.row["op"] == "plus" else a * b
        for word, operand in s.row["then"]:
            value = value + operand if word == "plus" else value * operand
        assert s.row["result"] == value and len(s.row["then"]) == 2
        tail = "".join(f", then {w} {x}" for w, x in s.row["then"])
        assert s.prompt[1].content == f"What is {a} {s.row['op']} {b}{tail}?"
    system = calculator.samples(1, 0, computations=2)[0].prompt[0].content
    assert system == (
        "Compute left to right with one tool call (add, subtract or multiply) per operation, each on the last "
        "result, then call answer with the result."
    )
    with pytest.raises(ConfigError, match="calculator computations must be a positive int, got 0"):
        calculator.samples(1, 0, computations=0)


def test_a_chain_allows_one_computation_per_operation_then_refuses():
    env = calculator.CalculatorEnv()
    env.reset(result=(3 + 4) * 5, then=[["times", 5]])
    assert env.add(3, 4) == "7" and env.multiply(7, 5) == "35"
    assert env.add(1, 1).startswith("Error: 2 computations per question") and not env.done
    assert env.answer(35) == calculator.RECORDED and env.done and env.get_reward() == 1.0


async def expert_episode(sample):
    """The expert plays ``sample`` on the bundled environment: its calls, the steps, the reward."""
    parser, env = get_parser(), get_env_spec("calculator").build()
    session = env.open(sample)
    conversation, calls, steps = list((await session.reset(sample)).prompt), [], []
    while not (steps and steps[-1].terminated) and len(steps) < 6:
        text = calculator.expert(conversation, parser)
        calls += parser.parse(text)
        conversation.append(Message("assistant", text, tool_calls=tuple(parser.parse(text))))
        steps.append(await session.step(tuple(conversation)))
        conversation.extend(steps[-1].messages)
    return calls, steps, await session.finish()


async def test_the_experts_chain_solves_it_exactly_when_every_tool_fits():
    rewards = []
    for sample in calculator.samples(16, 2, operations=PLUS_TIMES, computations=2, digits=2, balanced=True):
        calls, steps, final = await expert_episode(sample)
        names = [c.name for c in calls]
        assert len(steps) == 3 and steps[-1].terminated and names[-1] == "answer"
        assert calls[1].arguments["a"] == int(steps[0].messages[0].content)  # the second works on the first's result
        wanted = [calculator.OPERATIONS[sample.row["op"]], calculator.OPERATIONS[sample.row["then"][0][0]]]
        assert final == (1.0 if names[:2] == wanted else 0.0)
        rewards.append(final)
    assert sum(rewards) == 4  # a balanced block of 16: each tool sequence once per operation sequence


def test_balanced_chains_give_every_operation_and_tool_sequence_equally_often():
    parser = get_parser()
    questions = calculator.samples(32, 0, operations=PLUS_TIMES, computations=2, digits=2, balanced=True)
    kinds = Counter()
    for s in questions:
        ops = (s.row["op"], s.row["then"][0][0])
        kinds[ops, calculator.expert_tools(s.prompt[1].content, ["add", "multiply"])] += 1
    assert len(kinds) == 16 and set(kinds.values()) == {2}  # every (operations, tools) pair once per block of 16
    for start in range(0, 32, 4):  # and every run of 4 (a GRPO batch) asks each kind once, each tool sequence once
        run = questions[start : start + 4]
        assert len({(s.row["op"], s.row["then"][0][0]) for s in run}) == 4
        assert len({calculator.expert_tools(s.prompt[1].content, ["add", "multiply"]) for s in run}) == 4
    first_tool = Counter(parser.parse(calculator.expert(list(s.prompt), parser))[0].name for s in questions)
    assert first_tool == {"add": 16, "multiply": 16}


async def test_a_closing_episode_ends_with_the_reply_after_answer_and_the_reward_is_the_answers():
    sample = calculator.samples(4, 0, operations=PLUS_TIMES, closing=True)[0]
    assert sample.row["closing"] is True and sample.prompt[0].content.endswith(f", then reply {calculator.CLOSING}")
    tool = calculator.OPERATIONS[sample.row["op"]]
    replies = iter(
        [
            call(tool, a=sample.row["a"], b=sample.row["b"]),
            call("answer", value=sample.row["result"]),
            Message("assistant", calculator.CLOSING),
        ]
    )
    steps, final = await play(get_env_spec("calculator").build(), sample, lambda _: next(replies))
    assert [s.terminated for s in steps] == [False, False, True] and final == 1.0
    assert steps[1].messages[0].content == calculator.RECORDED
    env = calculator.CalculatorEnv()  # after answer, every tool refuses and changes nothing
    env.reset(result=7, closing=True)
    assert env.answer(8) == calculator.RECORDED and not env.done
    assert env.answer(7) == env.add(3, 4) == calculator.EPISODE_OVER and env.get_reward() == 0.0


def test_closing_demonstrations_teach_the_reply(tiny_model_dir):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    options = {"operations": list(PLUS_TIMES), "closing": True}
    result = asyncio.run(
        expert_demonstrations(
            "calculator", 8, renderer, RolloutConfig(max_turns=3, max_seq_len=4096), seed=1, options=options
        )
    )
    for trajectory in result.trajectories:
        assert trajectory.terminated and trajectory.turns == 3 and trajectory.error is None
        assert [m.content for m in trajectory.messages if m.role == "assistant"][-1] == calculator.CLOSING


async def test_a_continuation_starts_from_a_number_and_its_one_call_reads_the_word_after_then():
    samples = calculator.samples(8, 0, operations=PLUS_TIMES, digits=2, balanced=True, continuation=True)
    firsts = {a * b for a in range(10, 100) for b in range(10, 100)} | set(range(20, 199))
    for sample in samples:
        row = sample.row
        assert sample.prompt[1].content == f"What is {row['a']}, then {row['op']} {row['b']}?"
        assert row["continuation"] is True and "then" not in row and row["a"] in firsts
        assert row["result"] == (row["a"] + row["b"] if row["op"] == "plus" else row["a"] * row["b"])
        calls, steps, final = await expert_episode(sample)
        assert len(steps) == 2 and calls[0].arguments == {"a": row["a"], "b": row["b"]}
        assert final == (1.0 if calls[0].name == calculator.OPERATIONS[row["op"]] else 0.0)
    parser = get_parser()
    for unreadable in ("What is 986?", "What is 986, then?"):  # a number alone has no operation to call
        assert calculator.expert([Message("user", unreadable)], parser) == "I cannot read the question."
    kinds = Counter((s.row["op"], calculator.expert_tools(s.prompt[1].content, ["add", "multiply"])) for s in samples)
    assert set(kinds.values()) == {2} and len(kinds) == 4  # balanced: each (word, tool) pair once per block of 4
