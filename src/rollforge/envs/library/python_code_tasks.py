"""The ``python_code`` task set: small functions, each with a reference solution and hidden tests.

A task is a function name, a signature, a one-paragraph description shown to the model, and its
hidden tests. A hidden test is a pair of calls (argument lists); it passes when the submitted
function returns the expected value for both. The pairs are chosen so that no answer that ignores
the task passes any of them: each pair mixes outputs (a True case with a False one, an empty
result with a full one) and holds a call whose output is not its input. ``trivial_scores`` plays
those answers (``TRIVIAL_ANSWERS``: constants, the input itself) against every task; the best of
them scores 0.0 on every task, and ``check_env`` reports it (it fails above 0.1).

The tasks are the rows of two tables, ``python_code_text_tasks`` (strings and numbers) and
``python_code_list_tasks`` (lists), each row made by ``code_task.code_task``; this module orders
them (``DRAW_ORDER``) and derives the rest from them.

Expected outputs are never written by hand: they are the reference solution's outputs
(``expected_outputs``), so the table cannot disagree with itself, and the tests check that every
reference passes its own hidden tests inside the sandbox. Outputs are plain JSON values (str, int,
bool, None, lists, dicts with str keys), compared after a JSON round trip.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

from .code_task import Call, CodeTask
from .python_code_list_tasks import LIST_TASKS
from .python_code_text_tasks import TEXT_TASKS

#: The tasks' order in ``TASKS``, the one the table was first written in: ``samples`` draws by
#: position (``rng.choice(TASKS)``), so a seed keeps drawing the tasks it drew.
DRAW_ORDER: tuple[str, ...] = (
    "reverse_words",
    "is_palindrome",
    "count_vowels",
    "fizzbuzz",
    "running_sum",
    "second_largest",
    "flatten",
    "dedupe",
    "caesar",
    "run_length",
    "are_anagrams",
    "digit_sum",
    "chunk",
    "max_profit",
    "merge_sorted",
    "word_counts",
    "rotate",
    "is_prime",
    "to_binary",
    "transpose",
)

#: Every task (``TEXT_TASKS`` and ``LIST_TASKS``), in ``DRAW_ORDER``.
TASKS: tuple[CodeTask, ...] = tuple(sorted((*TEXT_TASKS, *LIST_TASKS), key=lambda task: DRAW_ORDER.index(task.name)))
TASKS_BY_NAME: dict[str, CodeTask] = {task.name: task for task in TASKS}


def _function(name: str, source: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {name}>", "exec"), namespace)  # trusted, bundled source
    return namespace[name]


def _outputs(function: Callable[..., Any], test: tuple[Call, ...]) -> str:
    """One test's outputs as canonical JSON, each call given fresh JSON-decoded arguments."""
    return canonical([function(*json.loads(json.dumps(call))) for call in test])


@functools.lru_cache(maxsize=None)
def expected_outputs(name: str) -> tuple[str, ...]:
    """The reference solution's outputs for each hidden test (a JSON list, one entry per call)."""
    task = TASKS_BY_NAME[name]
    reference = _function(name, task.reference)
    return tuple(_outputs(reference, test) for test in task.tests)


def canonical(value: Any) -> str:
    """A JSON value as comparable text (dict keys sorted)."""
    return json.dumps(value, sort_keys=True)


#: Answers that ignore the task: the usual constants, and the input given back.
TRIVIAL_ANSWERS: dict[str, Callable[..., Any]] = {
    **{
        f"return {value!r}": (lambda value: lambda *args: json.loads(json.dumps(value)))(value)
        for value in (True, False, None, 0, 1, -1, 2, "", " ", "0", "1", [], {}, [[]])
    },
    "return the first argument": lambda *args: args[0],
    "return the last argument": lambda *args: args[-1],
    "return the arguments as a list": lambda *args: list(args),
}


@functools.lru_cache(maxsize=None)
def trivial_scores(name: str) -> dict[str, float]:
    """Each trivial answer's score (fraction of hidden tests passed) on task ``name``."""
    expected = expected_outputs(name)
    tests = TASKS_BY_NAME[name].tests
    return {
        label: sum(_outputs(answer, test) == want for test, want in zip(tests, expected)) / len(tests)
        for label, answer in TRIVIAL_ANSWERS.items()
    }


def best_trivial_answer(name: str) -> tuple[str, float]:
    """The trivial answer that scores highest on task ``name``, and its score."""
    return max(trivial_scores(name).items(), key=lambda item: item[1])
