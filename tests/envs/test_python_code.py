"""The python_code environment: the task table, grading in the sandbox, the tools, the reward."""

from __future__ import annotations

import json

import pytest

from rollforge.envs.library import get_env_spec
from rollforge.envs.library.python_code import MAX_RUNS, PythonCodeEnv, grade_report
from rollforge.envs.library.python_code_tasks import TASKS, TASKS_BY_NAME, expected_outputs
from rollforge.envs.sandbox import SandboxResult, sandbox_support
from rollforge.types import Message, ToolCall

needs_sandbox = pytest.mark.skipif(sandbox_support() is not None, reason=f"no sandbox here: {sandbox_support()}")


def env_for(task: str) -> PythonCodeEnv:
    env = PythonCodeEnv()
    env.reset(task=task)
    return env


# -- the task table -------------------------------------------------------------------------------


def test_the_task_table():
    assert len(TASKS) == 20 and len(TASKS_BY_NAME) == 20
    for task in TASKS:
        assert task.signature.startswith(task.name + "(") and f"def {task.name}(" in task.reference
        assert len(task.tests) >= 3 and task.description
    # expected outputs come from the references; two worked by hand:
    assert expected_outputs("fizzbuzz")[3] == json.dumps(["1", "2", "Fizz", "4", "Buzz"])
    assert expected_outputs("run_length")[0] == '"a3b1"'  # aaab


@needs_sandbox
def test_every_reference_solution_passes_its_hidden_tests():
    for task in TASKS:
        env = env_for(task.name)
        text = env.submit(task.reference)
        assert env.get_reward() == 1.0, (task.name, text)
        assert text.startswith(f"Hidden tests: {len(task.tests)} of {len(task.tests)} passed.")


# -- grading ----------------------------------------------------------------------------------------


@needs_sandbox
def test_partial_credit_names_each_failure_without_revealing_inputs():
    env = env_for("is_prime")  # tests: 2, 1, 97, 91, -7, 7919
    code = """
def is_prime(n):
    if n == 91:
        raise ValueError("no")
    if n == 7919:
        while True:
            pass
    return n in (2, 97)
"""
    text = env.submit(code)
    assert env.done and env.get_reward() == pytest.approx(4 / 6)
    assert text.splitlines() == [
        "Hidden tests: 4 of 6 passed.",
        "test 1: passed",
        "test 2: passed",
        "test 3: passed",
        "test 4: raised ValueError",
        "test 5: passed",
        "test 6: raised TimeoutError",  # the per-test time limit; the run itself went on
    ]
    assert "7919" not in text and "91" not in text


@needs_sandbox
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("def is_prime(n:\n", "Your code could not be loaded: SyntaxError"),
        ("def prime(n):\n    return True\n", "Your code could not be loaded: AttributeError"),
        ("import os\nos._exit(0)\n", "test 1: not run"),
    ],
)
def test_code_that_cannot_be_graded_scores_zero(code, expected):
    env = env_for("is_prime")
    assert expected in env.submit(code) and env.get_reward() == 0.0


@needs_sandbox
def test_forged_report_lines_do_not_earn_reward():
    # The harness and the code share the report channel; the code writes first, claiming passes.
    forged = "".join(json.dumps({"case": i, "output": "true", "passed": True}) + "\n" for i in range(6))
    code = f"import os\nos.write(3, {forged.encode()!r})\ndef is_prime(n):\n    return True\n"
    env = env_for("is_prime")
    env.submit(code)
    # The first record per test wins and "true" is only right for the primes 2, 97 and 7919.
    assert env.get_reward() == pytest.approx(3 / 6)


def test_grade_report_ignores_garbage_and_out_of_range_cases():
    result = SandboxResult("exited", 0, None, "", "", "junk\n[1]\n" + json.dumps({"case": 9, "output": "1"}) + "\n"
                           + json.dumps({"case": 0, "output": "1"}) + "\n", 0.1)
    score, text = grade_report(result, ("1", "2"))
    assert score == 0.5 and text.splitlines() == ["Hidden tests: 1 of 2 passed.", "test 1: passed", "test 2: not run"]


# -- the tools --------------------------------------------------------------------------------------


@needs_sandbox
def test_run_shows_status_and_streams_and_is_limited():
    env = env_for("digit_sum")
    text = env.run("import sys\nprint('hi')\nprint('oops', file=sys.stderr)\nsys.exit(2)")
    assert text == f"Run 1 of {MAX_RUNS}: exit status 2.\nstdout:\nhi\n\nstderr:\noops\n"
    for _ in range(MAX_RUNS - 1):
        env.run("pass")
    assert "No runs left" in env.run("print(1)")
    assert not env.done


@needs_sandbox
def test_without_a_submission_the_last_run_is_graded():
    env = env_for("digit_sum")
    assert env.get_reward() == 0.0  # nothing to grade
    env.run("def digit_sum(n):\n    return 0\n")
    env.run(TASKS_BY_NAME["digit_sum"].reference)
    assert env.get_reward() == 1.0


def test_an_unknown_task_is_named():
    with pytest.raises(ValueError, match="unknown python_code task 'sort_it'; tasks are: reverse_words"):
        PythonCodeEnv().reset(task="sort_it")


@needs_sandbox
async def test_an_episode_through_the_factory():
    spec = get_env_spec("python_code")
    sample = next(s for s in spec.samples(40, 0) if s.row["task"] == "to_binary")
    assert "to_binary(n: int) -> str" in sample.prompt[-1].content
    session = spec.build().open(sample)
    reset = await session.reset(sample)
    assert [t["function"]["name"] for t in reset.tools] == ["run", "submit"]
    conversation = list(reset.prompt)
    for name, code in [("run", "print(bin(5))"), ("submit", "def to_binary(n):\n    return bin(n)[2:]\n")]:
        conversation.append(Message("assistant", "", tool_calls=(ToolCall(name, {"code": code}),)))
        step = await session.step(tuple(conversation))
        conversation.extend(step.messages)
    assert "0b101" in conversation[-3].content
    assert step.terminated and conversation[-1].content.startswith("Hidden tests: 4 of 4 passed.")
    assert await session.finish() == 1.0
    await session.close()
