"""The python_code environment: the task table, grading in the sandbox, the tools, the reward."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollforge.envs.check import TRIVIAL_ANSWER_LIMIT, check_env
from rollforge.envs.library import get_env_spec, python_code_tasks
from rollforge.envs.library.python_code import MAX_RUNS, PythonCodeEnv, grade_report
from rollforge.envs.library.python_code_tasks import (
    TASKS,
    TASKS_BY_NAME,
    TRIVIAL_ANSWERS,
    best_trivial_answer,
    expected_outputs,
    trivial_scores,
)
from rollforge.envs.sandbox import SandboxResult, runner, sandbox_support
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
        assert len(task.tests) == 10 and all(len(test) == 2 for test in task.tests) and task.description
    # expected outputs come from the references, one list per pair of calls; two worked by hand:
    assert expected_outputs("fizzbuzz")[1] == json.dumps([[], ["1", "2", "Fizz", "4", "Buzz"]])  # 0, 5
    assert expected_outputs("run_length")[0] == '["a3b1", ""]'  # aaab, (empty)


@pytest.mark.parametrize("name", [task.name for task in TASKS])
def test_no_answer_that_ignores_the_task_scores_above_the_limit(name):
    scores = trivial_scores(name)
    assert len(scores) == len(TRIVIAL_ANSWERS) >= 17
    label, best = best_trivial_answer(name)
    assert best <= TRIVIAL_ANSWER_LIMIT == 0.1, (name, label, best)


def test_trivial_scores_count_passed_pairs():
    # Before the pairs, "return True" passed 3 of is_prime's 6 single-call tests; a pair passes
    # only when both of its calls expect the answer's value.
    assert trivial_scores("is_prime")["return True"] == 0.0
    assert trivial_scores("rotate")["return the first argument"] == 0.0  # (items, 0) alone would pass
    assert [json.loads(e) for e in expected_outputs("is_prime")[:2]] == [[True, False], [True, False]]


@needs_sandbox
def test_trivial_answers_score_what_the_host_computes_when_graded_in_the_sandbox():
    answers = [("return True", "True"), ("return the first argument", "args[0]"), ("return []", "[]")]
    for index, task in enumerate(TASKS):
        label, body = answers[index % len(answers)]
        env = env_for(task.name)
        env.submit(f"def {task.name}(*args):\n    return {body}\n")
        assert env.get_reward() == trivial_scores(task.name)[label] == 0.0, (task.name, label)


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
    env = env_for("is_prime")  # pairs: (2, 1) (97, 91) (-7, 7919) (0, 3) (4, 13) (17, 21) (25, 29)
    code = """                 # (7917, 101) (49, 2147483647) (1000003, 1000001)
def is_prime(n):
    if n == 91:
        raise ValueError("no")
    if n == 2147483647:
        while True:
            pass
    return n in (2, 97, 7919, 3, 13, 17, 29, 1000003)
"""
    text = env.submit(code)
    assert env.done and env.get_reward() == pytest.approx(7 / 10)
    assert text.splitlines() == [
        "Hidden tests: 7 of 10 passed.",
        "test 1: passed",
        "test 2: raised ValueError",
        "test 3: passed",
        "test 4: passed",
        "test 5: passed",
        "test 6: passed",
        "test 7: passed",
        "test 8: wrong answer",  # 101 is prime
        "test 9: raised TimeoutError",  # the per-call time limit; the run itself went on
        "test 10: passed",
    ]
    assert "7919" not in text and "91" not in text and "2147483647" not in text


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
    forged = "".join(json.dumps({"case": i, "output": "[true, true]", "passed": True}) + "\n" for i in range(10))
    code = f"import os\nos.write(3, {forged.encode()!r})\ndef is_prime(n):\n    return True\n"
    env = env_for("is_prime")
    env.submit(code)
    # The first record per test wins, and every pair holds a prime and a non-prime.
    assert env.get_reward() == 0.0


def test_grade_report_ignores_garbage_and_out_of_range_cases():
    result = SandboxResult(
        "exited",
        0,
        None,
        "",
        "",
        "junk\n[1]\n" + json.dumps({"case": 9, "output": "1"}) + "\n" + json.dumps({"case": 0, "output": "1"}) + "\n",
        0.1,
    )
    score, text = grade_report(result, ("1", "2"))
    assert score == 0.5 and text.splitlines() == ["Hidden tests: 1 of 2 passed.", "test 1: passed", "test 2: not run"]


#: The submission that read the hidden tests in a regular install: it reads the task tables in the
#: folder where rollforge installed them and runs the reference solution it finds there.
STEAL = """
import ast, os, sys
def _steal(name):
    try:
        for file in sorted(os.listdir({folder!r})):
            if file.endswith(".py"):
                for node in ast.walk(ast.parse(open(os.path.join({folder!r}, file)).read())):
                    if isinstance(node, ast.Constant) and str(node.value).startswith("def " + name + "("):
                        namespace = {{}}
                        exec(node.value, namespace)
                        return namespace[name]
    except OSError as exc:
        print(exc, file=sys.stderr)
{name} = _steal({name!r})
"""


@needs_sandbox
@pytest.mark.parametrize("hidden", [True, False])
def test_the_task_module_is_hidden_in_a_regular_install(monkeypatch, tmp_path, hidden):
    # A regular install puts rollforge in site-packages, inside the interpreter's bound prefix.
    # Lay one out under tmp_path, bind it into the jail and tell the sandbox rollforge lives there.
    package = tmp_path / "site-packages" / "rollforge"
    library = package / "envs" / "library"
    shutil.copytree(Path(python_code_tasks.__file__).parent, library, ignore=shutil.ignore_patterns("__pycache__"))
    binds = runner._binds
    monkeypatch.setattr(runner, "_binds", lambda: [*binds(), str(package.parent)])
    monkeypatch.setattr(runner, "_PACKAGE_DIR", package)
    if not hidden:  # without the masks the attack works: this test can fail
        monkeypatch.setattr(runner, "_masks", lambda: [])
    for name in ["is_prime", "word_counts", "transpose"] if hidden else ["is_prime"]:
        env = env_for(name)
        text = env.submit(STEAL.format(folder=str(library), name=name))
        assert env.get_reward() == (0.0 if hidden else 1.0), text
        if hidden:  # the tables could not be read, so the stolen function is None
            assert "test 1: raised TypeError" in text


def test_hostile_report_lines_are_failed_tests_not_grader_crashes():
    deep = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on this
    nested = json.dumps([[[["x"]]]])
    lines = [
        deep,
        '{"case": 0, "output": ' + deep + "}",
        '{"load_error": ' + nested + ', "case": 0, "output": ' + nested + "}",  # not str: ignored
        json.dumps({"case": True, "output": "2"}),  # a bool is not a case number
        json.dumps({"case": 1, "error": "E" * 10_000}),
        json.dumps({"case": 0, "output": "1"}),
    ]
    result = SandboxResult("exited", 0, None, "", "", "\n".join(lines) + "\n", 0.1)
    score, text = grade_report(result, ("1", "2"))
    assert score == 0.5
    assert text.splitlines() == ["Hidden tests: 1 of 2 passed.", "test 1: passed", "test 2: raised " + "E" * 80 + "..."]


@needs_sandbox
def test_a_submission_that_writes_hostile_report_lines_is_still_graded():
    deep = "os.write(3, b'[' * 300_000 + b']' * 300_000 + b'\\n' + b'{\"load_error\": ' + b'[' * 50_000 + b'\\n')\n"
    env = env_for("digit_sum")
    env.submit("import os\n" + deep + TASKS_BY_NAME["digit_sum"].reference)
    assert env.get_reward() == 1.0


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
    assert step.terminated and conversation[-1].content.startswith("Hidden tests: 10 of 10 passed.")
    assert await session.finish() == 1.0
    await session.close()


@needs_sandbox
def test_check_env_reports_the_best_trivial_answer():
    spec = get_env_spec("python_code")
    sample = spec.samples(1, 0)[0]
    report = check_env(spec, samples=[sample], steps=1)
    assert report.best_trivial_answer == best_trivial_answer(sample.row["task"])
    assert report.best_trivial_answer[1] == 0.0 and str(report).endswith("scores 0.00")


REGULAR_INSTALL = """
import json, os, sys
from rollforge.envs.sandbox import run_sandboxed, runner
from rollforge.envs.library import python_code_tasks
from rollforge.envs.library.python_code import PythonCodeEnv
assert python_code_tasks.__file__.startswith(sys.prefix), python_code_tasks.__file__  # the installed copy
scores = []
for name in ("is_prime", "rotate"):
    env = PythonCodeEnv()
    env.reset(task=name)
    env.submit({steal!r}.format(folder=os.path.dirname(python_code_tasks.__file__), name=name))
    scores.append(env.get_reward())
code = "import json, math, select, _json; print(json.dumps(sorted(__import__('os').listdir({site!r}))))"
result = run_sandboxed({{"main.py": code}}, [sys.executable, "-I", "-S", "main.py"])
print(json.dumps([scores, result.stdout, result.stderr[-500:]]))
"""


@needs_sandbox
def test_a_regular_install_in_a_virtual_environment_keeps_the_hidden_tests_hidden(tmp_path):
    # rollforge copied into a venv's site-packages, as pip installs it; the venv is the interpreter's
    # prefix, so the sandbox binds it. Its extension modules (lib-dynload) must still load.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shutil.copytree(Path(python_code_tasks.__file__).parents[2], Path(site) / "rollforge")
    script = REGULAR_INSTALL.format(steal=STEAL, site=site)
    done = subprocess.run(
        [python, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    scores, listing, stderr = json.loads(done.stdout.splitlines()[-1])
    assert scores == [0.0, 0.0] and listing == "[]\n", stderr
