"""``python_code``: write a small Python function; hidden tests decide the reward (tool class).

The row column ``task`` names a task of ``python_code_tasks.TASKS``. Two tools, each running the
model's code in a fresh sandbox (``envs/sandbox``: no network, a private scratch folder as the
working directory, CPU, wall, memory, process and output limits):

- ``run(code)`` runs ``code`` as a script and returns its exit status, stdout and stderr, so the
  model can try things (at most ``MAX_RUNS`` times per episode);
- ``submit(code)`` runs the hidden tests against the function ``code`` defines and ends the
  episode. The observation says which tests passed, failed or raised, without their inputs.

The reward is the fraction of hidden tests passed by the submitted code. When the episode ends
without a submission, the code of the last ``run`` is graded instead (0.0 when there is none).

Grading is done on the host: inside the sandbox a small harness imports ``solution.py``, calls
the function on each test's calls (each bounded by ``CASE_SECONDS``) and writes one JSON line
per test to the report channel (fd 3); the host compares those outputs with the reference
solution's, which never enter the sandbox (nor do the task modules: the sandbox hides
rollforge's installation). Code that forges report lines can only claim outputs it computed
itself, so the only way to the reward is to produce the right outputs; no answer that ignores
the task (a constant, the input given back) passes any hidden test (``python_code_tasks``;
``check_env`` reports the figure). The report is hostile input: a line that does not parse (too
deep, not JSON), or whose fields are not what the harness writes, counts for nothing, and every
text from it is cut short before it reaches the model.
"""

from __future__ import annotations

import json
import random
import sys

from ...errors import EnvironmentError_
from ...types import Message, Sample
from ..base import Environment
from ..sandbox import SCRATCH_DIR, SandboxLimits, SandboxResult, run_sandboxed
from . import python_code_tasks
from .code_task import CodeTask
from .python_code_tasks import TASKS, TASKS_BY_NAME, expected_outputs

MAX_RUNS = 5
CASE_SECONDS = 1.0
LIMITS = SandboxLimits(cpu_seconds=3, wall_seconds=6.0, memory_bytes=512 << 20, processes=8)
#: Characters of stdout and of stderr shown to the model per run.
SHOWN_CHARS = 1500

SYSTEM_PROMPT = (
    "You are a careful Python programmer. You can call tools: run(code) executes a Python script "
    "and shows its output; submit(code) grades your final solution against hidden tests and ends "
    "the task. Submit code that defines the requested function."
)

_HARNESS = """\
import json, os, signal, sys
sys.path.insert(0, %(scratch)r)  # -I leaves the working directory out
report = os.fdopen(3, "w", buffering=1)
def emit(**record):
    report.write(json.dumps(record) + "\\n")
def too_slow(signum, frame):
    raise TimeoutError("took longer than %(seconds)ss")
signal.signal(signal.SIGALRM, too_slow)
try:
    import solution
    function = getattr(solution, %(name)r)
except BaseException as exc:
    emit(load_error="%%s: %%s" %% (type(exc).__name__, exc))
    sys.exit(1)
for case, calls in enumerate(json.load(open("cases.json"))):
    try:
        outputs = []
        for args in calls:
            signal.setitimer(signal.ITIMER_REAL, %(seconds)s)
            outputs.append(function(*args))
            signal.setitimer(signal.ITIMER_REAL, 0)
        emit(case=case, output=json.dumps(outputs, sort_keys=True))
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        emit(case=case, error=type(exc).__name__)
"""


def _python() -> list[str]:
    return [sys.executable, "-I", "-S"]


def _head(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n... ({len(text) - limit} more characters)"


def _tail(text: str, limit: int = SHOWN_CHARS) -> str:
    """The end of stderr, where a traceback's cause is."""
    return text if len(text) <= limit else f"... ({len(text) - limit} characters before)\n{text[-limit:]}"


class PythonCodeEnv:
    """One coding task per episode: ``run`` to experiment, ``submit`` to be graded."""

    def __init__(self) -> None:
        self._task: CodeTask | None = None
        self._runs = 0
        self._last_code: str | None = None
        self._score: float | None = None
        self.done = False

    def reset(self, task: str, **_: object) -> None:
        if task not in TASKS_BY_NAME:
            raise ValueError(f"unknown python_code task {task!r}; tasks are: {', '.join(TASKS_BY_NAME)}")
        self._task = TASKS_BY_NAME[task]
        self._runs, self._last_code, self._score, self.done = 0, None, None, False
        return None

    def run(self, code: str) -> str:
        """Run a Python script in a sandbox and show its exit status, stdout and stderr.

        Args:
            code: The complete Python script to run.
        """
        if self._runs >= MAX_RUNS:
            return f"No runs left (the limit is {MAX_RUNS}); call submit with your solution."
        self._runs += 1
        self._last_code = code
        result = run_sandboxed({"main.py": code}, [*_python(), "main.py"], LIMITS)
        return "\n".join(
            [
                f"Run {self._runs} of {MAX_RUNS}: {result.describe()}.",
                "stdout:",
                _head(result.stdout) or "(empty)",
                "stderr:",
                _tail(result.stderr) or "(empty)",
            ]
        )

    def submit(self, code: str) -> str:
        """Grade your solution against the hidden tests; this ends the task.

        Args:
            code: Python code that defines the requested function.
        """
        self.done = True
        self._score, text = self._grade(code)
        return text

    def get_reward(self) -> float:
        if self._score is None and self._last_code is not None:
            self._score, _ = self._grade(self._last_code)
        return self._score or 0.0

    def _grade(self, code: str) -> tuple[float, str]:
        task = self._task
        if task is None:
            raise EnvironmentError_("PythonCodeEnv: a tool was called before reset(task=...)")
        harness = _HARNESS % {"name": task.name, "seconds": CASE_SECONDS, "scratch": SCRATCH_DIR}
        cases = [[list(call) for call in test] for test in task.tests]
        files = {"solution.py": code, "harness.py": harness, "cases.json": json.dumps(cases)}
        result = run_sandboxed(files, [*_python(), "harness.py"], LIMITS)
        return grade_report(result, expected_outputs(task.name))


def grade_report(result: SandboxResult, expected: tuple[str, ...]) -> tuple[float, str]:
    """(fraction of tests passed, the observation) from the harness's report lines."""
    outcomes: dict[int, str] = {}
    load_error = None
    for line in result.report.splitlines():
        record = _record(line)
        if record is None:
            continue
        if isinstance(record.get("load_error"), str) and load_error is None:
            load_error = _short(record["load_error"], 300)
        case = record.get("case")
        if type(case) is int and 0 <= case < len(expected) and case not in outcomes:
            if isinstance(record.get("output"), str):
                outcomes[case] = "passed" if record["output"] == expected[case] else "wrong answer"
            elif isinstance(record.get("error"), str):
                outcomes[case] = f"raised {_short(record['error'], 80)}"
    passed = sum(outcome == "passed" for outcome in outcomes.values())
    lines = [f"Hidden tests: {passed} of {len(expected)} passed."]
    if load_error is not None:
        lines.append(f"Your code could not be loaded: {load_error}")
    lines += [f"test {i + 1}: {outcomes.get(i, 'not run')}" for i in range(len(expected))]
    if not result.ok and load_error is None:
        lines.append(f"The test run ended abnormally ({result.describe()}).")
        if result.stderr:
            lines.append(_tail(result.stderr))
    return passed / len(expected), "\n".join(lines)


def _record(line: str) -> dict | None:
    """One report line as a dict, or None: the sandboxed code may write anything there."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        return None
    return record if isinstance(record, dict) else None


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def build() -> Environment:
    from ..factory import FactoryEnvironment
    from ..sandbox import SandboxUnavailable, sandbox_support

    reason = sandbox_support()
    if reason is not None:
        raise SandboxUnavailable(f"the python_code environment needs the sandbox: {reason}")
    return FactoryEnvironment(PythonCodeEnv)


def samples(n: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        task = rng.choice(TASKS)
        prompt = (Message("system", SYSTEM_PROMPT), Message("user", task.prompt()))
        out.append(Sample(prompt=prompt, task_name="python_code", row={"task": task.name}))
    return out


def best_trivial_answer(sample: Sample) -> tuple[str, float]:
    """The answer ignoring the task that scores highest on ``sample``'s hidden tests, and its score."""
    return python_code_tasks.best_trivial_answer(sample.row["task"])


__all__ = ["PythonCodeEnv", "best_trivial_answer", "build", "samples", "grade_report"]
