"""check_env: every bundled environment passes; broken environments are caught with a clear rule."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import random
from typing import Any, Literal

import pytest

from rollforge.envs.base import BaseSession, Reset, Step
from rollforge.envs.check import acheck_env, check_env
from rollforge.envs.factory import FactoryEnvironment
from rollforge.envs.library import ENV_NAMES, get_env_spec
from rollforge.envs.library.guess_number import GuessNumberEnv
from rollforge.envs.stepwise import StepwiseEnvironment, StepwiseReturn
from rollforge.envs.sandbox import SandboxUnavailable
from rollforge.errors import ConfigError, EnvironmentError_, MissingDependency
from rollforge.types import Failure, Message, Sample

SAMPLES = [Sample(prompt=(Message("user", "play"),), row={"seed": 1})]


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_bundled_environment_passes(name):
    try:
        spec = get_env_spec(name)
        spec.build()
    except (MissingDependency, SandboxUnavailable) as exc:  # an optional extra; CI installs them all
        pytest.skip(str(exc))
    check_env(spec)


def test_a_bundled_environment_by_name():
    check_env("catch", steps=4, seed=3)
    with pytest.raises(ConfigError, match="unknown environment 'pong'"):
        check_env("pong")


async def test_async_face_and_explicit_samples():
    spec = get_env_spec("guess_number")
    await acheck_env(StepwiseEnvironment(GuessNumberEnv()), samples=spec.samples(4, 3), steps=6, seed=9)


def test_a_bare_environment_needs_samples():
    with pytest.raises(ConfigError, match="samples"):
        check_env(StepwiseEnvironment(GuessNumberEnv()))


async def test_the_sync_face_runs_inside_a_loop():  # a notebook cell (workers.run_sync)
    assert check_env(get_env_spec("echo"), steps=2).name == "echo"


# -- a hand-written session whose behaviour each test breaks in one way ------------------------

GOOD_TOOL = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Do something.",
        "parameters": {
            "type": "object",
            "properties": {"how": {"type": "string", "enum": ["a", "b"]}},
            "required": ["how"],
        },
    },
}


class GoodSession(BaseSession):
    """A correct tool session: a valid call gets a tool message, a bad one a counted failure,
    and the episode terminates after three calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = 0

    async def reset(self, sample: Sample) -> Reset:
        return Reset(prompt=sample.prompt, tools=(GOOD_TOOL,))

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        call = conversation[-1].tool_calls[0]
        if call.error or call.name != "act" or call.arguments.get("how") not in ("a", "b"):
            return Step(messages=(Message("tool", "Error: bad call"),), failures=(Failure("tool_unknown", "bad"),))
        self.calls += 1
        return Step(messages=(Message("tool", f"did {call.arguments['how']}"),), terminated=self.calls == 3)

    async def finish(self) -> float:
        return 1.0

    async def close(self) -> None:
        self.closed += 1


class Env:
    """An Environment opening sessions of the given class."""

    def __init__(self, session_class: type, max_sessions: Any = None):
        self.session_class = session_class
        self.max_sessions = max_sessions

    def open(self, sample: Sample) -> Any:
        return self.session_class()


def test_the_good_session_passes():
    check_env(Env(GoodSession), samples=SAMPLES)


class OutOfTime(GoodSession):
    """Truncated after its first valid call (its own limit); stepping it again is a broken contract."""

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self.calls:
            raise RuntimeError("stepped after the episode was truncated")
        step = await super().step(conversation)
        return Step(messages=step.messages, failures=step.failures, truncated=self.calls == 1)


def test_a_truncated_episode_is_over_and_not_stepped_again():
    check_env(Env(OutOfTime), samples=SAMPLES)


class NonFloatReward(GoodSession):
    async def step(self, conversation):
        step = await super().step(conversation)
        return Step(messages=step.messages, reward="1", terminated=step.terminated, failures=step.failures)


class IntReward(GoodSession):
    async def step(self, conversation):
        return Step(messages=(Message("tool", "ok"),), reward=1, terminated=True)


class NanFinish(GoodSession):
    async def finish(self):
        return math.nan


class EmptyPrompt(GoodSession):
    async def reset(self, sample):
        return Reset(prompt=())


class DictPrompt(GoodSession):
    async def reset(self, sample):
        return Reset(prompt=({"role": "user", "content": "hi"},))


class RequiredNotInProperties(GoodSession):
    async def reset(self, sample):
        schema = {
            "type": "function",
            "function": {"name": "act", "parameters": {"type": "object", "properties": {}, "required": ["how"]}},
        }
        return Reset(prompt=sample.prompt, tools=(schema,))


class NotAFunctionSchema(GoodSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt, tools=({"name": "act", "parameters": {}},))


class DuplicateTools(GoodSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt, tools=(GOOD_TOOL, GOOD_TOOL))


class IntTerminated(GoodSession):
    async def step(self, conversation):
        return Step(messages=(Message("tool", "ok"),), terminated=1)


class IntTruncated(GoodSession):
    async def step(self, conversation):
        return Step(messages=(Message("tool", "ok"),), truncated=0)


class ListMessages(GoodSession):
    async def step(self, conversation):
        return Step(messages=[Message("tool", "ok")], terminated=True)


class RaisesOnBadCalls(GoodSession):
    async def step(self, conversation):
        call = conversation[-1].tool_calls[0]
        if call.name != "act":
            raise KeyError(call.name)
        return await super().step(conversation)


class SilentOnBadCalls(GoodSession):
    async def step(self, conversation):
        call = conversation[-1].tool_calls[0]
        if call.name != "act":
            return Step(messages=(Message("tool", "?"),))
        return await super().step(conversation)


class CloseTwiceRaises(GoodSession):
    async def close(self):
        self.closed += 1
        if self.closed > 1:
            raise RuntimeError("already closed")


class Hangs(GoodSession):
    async def step(self, conversation):
        await asyncio.sleep(60)


class SyncMethods(GoodSession):
    def finish(self):  # type: ignore[override]
        return 1.0


_counter = itertools.count()


class SharedState(GoodSession):
    """Observations depend on a module-level counter shared by all sessions."""

    async def step(self, conversation):
        step = await super().step(conversation)
        return Step(
            messages=(Message("tool", f"call number {next(_counter)}"),),
            terminated=step.terminated,
            failures=step.failures,
        )


@pytest.mark.parametrize(
    ("session_class", "complaint"),
    [
        (
            NonFloatReward,
            "step 1 (sample 0) raised EnvironmentError_: Step.reward must be a finite number, got str '1'",
        ),
        (IntReward, "Step.reward must be a float, got int 1"),
        (NanFinish, "finish (sample 0): the final reward must be finite, got nan"),
        (EmptyPrompt, "Reset.prompt must be a non-empty tuple of Message"),
        (DictPrompt, "Reset.prompt holds a dict, expected Message"),
        (RequiredNotInProperties, "tool act: required names ['how'] that are not in properties"),
        (NotAFunctionSchema, "a tool schema must be a dict with type 'function'"),
        (DuplicateTools, "tool names must be unique, ['act'] repeat"),
        (IntTerminated, "Step.terminated must be a bool, got 1"),
        (IntTruncated, "Step.truncated must be a bool, got 0"),
        (ListMessages, "Step.messages must be a tuple of Message"),
        (
            RaisesOnBadCalls,
            "a call to an unknown tool (sample 0), which must report a failure rather than raise, raised KeyError",
        ),
        (SilentOnBadCalls, "the Step has no failure; bad tool calls must be counted"),
        (CloseTwiceRaises, "a second close (sample 0), which must be harmless, raised RuntimeError: already closed"),
        (SyncMethods, "finish (sample 0) returned float 1.0 instead of an awaitable; EnvSession methods are async"),
        (SharedState, "not deterministic: two sessions of sample 0 given the same actions diverged at step 1"),
    ],
)
def test_broken_sessions_are_caught(session_class, complaint):
    with pytest.raises(EnvironmentError_) as info:
        check_env(Env(session_class), samples=SAMPLES)
    message = str(info.value)
    assert message.startswith("check_env(Env): ")
    assert complaint in message


def test_a_hanging_step_times_out():
    with pytest.raises(EnvironmentError_, match=r"step 1 \(sample 0\) did not return within 0.1s"):
        check_env(Env(Hangs), samples=SAMPLES, timeout=0.1)


@pytest.mark.parametrize("limit", [0, "4", True])
def test_bad_max_sessions(limit):
    with pytest.raises(EnvironmentError_, match="max_sessions must be None or a positive int"):
        check_env(Env(GoodSession, max_sessions=limit), samples=SAMPLES)


def test_not_an_environment():
    with pytest.raises(EnvironmentError_, match="has no open"):
        check_env(object(), samples=SAMPLES)


def test_max_sessions_one_plays_the_determinism_runs_one_at_a_time():
    check_env(Env(GoodSession, max_sessions=1), samples=SAMPLES)


# -- broken environments in the user-facing styles ---------------------------------------------


class RandomCatch:
    """An environment class whose tool output depends on an unseeded RNG."""

    def reset(self, seed: int, **_: object) -> str:
        return "Move!"

    def move(self, direction: Literal["left", "right"]) -> str:
        """Move.

        Args:
            direction: Where to go.
        """
        return f"The ball is at {random.randrange(10**9)}"


class RaisingTool:
    """A tool that raises is reported to the model as a failure: not a contract violation."""

    def reset(self, **_: object) -> None:
        return None

    def divide(self, a: int, b: int) -> float:
        """Divide.

        Args:
            a: Numerator.
            b: Denominator.
        """
        return a / b


class NoisyGrader:
    """A step-style environment whose reward is random."""

    def step(self, message_logs, metadata):
        n = len(message_logs)
        return StepwiseReturn(
            [{"content": ""}] * n, metadata, [None] * n, [random.random() for _ in range(n)], [True] * n
        )


class ShortReturn:
    def step(self, message_logs, metadata):
        return StepwiseReturn([], [], [], [], [])


def test_a_nondeterministic_environment_class_is_caught():
    with pytest.raises(EnvironmentError_, match="not deterministic.*seed any randomness from the sample's row"):
        check_env(FactoryEnvironment(RandomCatch), samples=SAMPLES)


def test_a_nondeterministic_step_environment_is_caught():
    with pytest.raises(EnvironmentError_, match="not deterministic"):
        check_env(StepwiseEnvironment(NoisyGrader()), samples=SAMPLES)


def test_a_step_environment_returning_too_few_entries_is_caught():
    with pytest.raises(
        EnvironmentError_,
        match=r"step 1 \(sample 0\) raised EnvironmentError_: ShortReturn.step "
        r"was given a batch of 1 but returned 0 observations",
    ):
        check_env(StepwiseEnvironment(ShortReturn()), samples=SAMPLES)


def test_a_tool_that_raises_is_not_a_violation():
    check_env(FactoryEnvironment(RaisingTool), samples=SAMPLES)


# -- rule 7: environments graded by hidden tests -------------------------------------------------


@pytest.mark.parametrize("score", [0.0, 0.1, 0.75])
def test_the_best_trivial_answer_is_reported_and_bounded(score):
    echo = get_env_spec("echo")
    spec = dataclasses.replace(echo, best_trivial_answer=lambda sample: ("return True", score))
    if score > 0.1:
        expected = r"an answer that ignores the task \(return True\) scores 0.75 on sample 0, above 0.1"
        with pytest.raises(EnvironmentError_, match=expected):
            check_env(spec, steps=2)
        return
    report = check_env(spec, steps=2)
    assert report.best_trivial_answer == ("return True", score) and report.samples == 3
    assert str(report) == (
        f"check_env(echo): every rule holds on 3 samples; best answer that ignores the task (return True) scores {score:.2f}"
    )
    assert check_env(echo, steps=2).best_trivial_answer is None
