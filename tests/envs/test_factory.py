"""The environment_factory adapter (rollforge.envs.factory), driven with TRL-style classes."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest

from rollforge.chat.toolcalls import get_parser
from rollforge.envs.base import Environment, EnvSession, Reset, Step
from rollforge.envs.factory import FactoryEnvironment, FactorySession
from rollforge.errors import ConfigError, EnvironmentError_
from rollforge.types import Failure, Message, Sample, ToolCall

try:
    from PIL import Image

    def make_image():
        return Image.new("RGB", (2, 2))

except ImportError:  # PIL is optional; a stand-in with the same surface is enough here

    class FakeImage:
        mode = "RGB"
        size = (2, 2)

        def save(self, fp, format=None):
            fp.write(b"fake")

    def make_image():
        return FakeImage()


# --- environment classes written exactly as a TRL user would: no rollforge imports ---


class LineWalker:
    """Walk along a line until you reach the target cell."""

    def __init__(self):
        self.position = 0
        self.target = 2
        self.done = False
        self.seen_columns = {}
        self.closed = 0

    def reset(self, **kwargs) -> str | None:
        self.seen_columns = dict(kwargs)
        self.target = kwargs.get("target", 2)
        self.position = 0
        self.done = False
        return f"You are at 0. Reach {self.target}."

    def move(self, direction: Literal["left", "right"]) -> str:
        """Move one cell.

        Args:
            direction: Which way to move.

        Returns:
            Where you are now.
        """
        self.position += 1 if direction == "right" else -1
        if self.position == self.target:
            self.done = True
        return f"You are at {self.position}."

    def jump(self, cells: int) -> str:
        """Jump to the right.

        Args:
            cells: How many cells to jump, at most 3.
        """
        if cells > 3:
            raise ValueError(f"cannot jump {cells} cells, at most 3")
        self.position += cells
        if self.position == self.target:
            self.done = True
        return f"You are at {self.position}."

    def get_reward(self) -> float:
        return 1.0 if self.position == self.target else 0.0

    def close(self) -> None:
        self.closed += 1


class Calculator:
    """A reset that names its columns: it gets only those."""

    def reset(self, a: int, b: int) -> str:
        self.a, self.b = a, b
        self.answered = None
        return f"Compute {a} * {b}."

    def multiply(self, x: float, y: float) -> float:
        """Multiply two numbers.

        Args:
            x: The first factor.
            y: The second factor.
        """
        return x * y

    def get_reward(self) -> int:
        return 1


class Silent:
    """No reset, no reward: a bag of tools."""

    def echo(self, text: str) -> None:
        """Say nothing back.

        Args:
            text: Ignored.
        """
        return None


class AsyncBrowser:
    """Async tools, reward and close."""

    def __init__(self):
        self.closed = False
        self.pages = []

    async def reset(self, **kwargs) -> None:
        await asyncio.sleep(0)
        return None

    async def open_page(self, url: str) -> str:
        """Open a web page.

        Args:
            url: The address.
        """
        await asyncio.sleep(0)
        self.pages.append(url)
        return f"<html>{url}</html>"

    async def get_reward(self) -> float:
        return 0.5 * len(self.pages)

    async def close(self) -> None:
        self.closed = True


class Camera:
    """Tools that return images."""

    def snapshot(self):
        """Take a picture."""
        return make_image()

    def annotated(self) -> list:
        """A picture with captions."""
        return ["before", make_image(), "after", make_image()]


# --- helpers ---


def sample(row=None, prompt=("system", "Be brief.", "user", "Walk.")) -> Sample:
    messages = [{"role": prompt[i], "content": prompt[i + 1]} for i in range(0, len(prompt), 2)]
    return Sample(prompt=tuple(messages), row=row or {})


def said(*calls: ToolCall, content: str = "...") -> tuple[Message, ...]:
    return (Message(role="user", content="Walk."), Message(role="assistant", content=content, tool_calls=calls))


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


async def started(factory, row=None, **options) -> FactorySession:
    session = FactoryEnvironment(factory, **options).open(sample(row))
    await session.reset(sample(row))
    return session


def tool_message(content: str, name: str | None) -> Message:
    return Message(role="tool", content=content, name=name)


# --- construction ---


def test_satisfies_the_protocols():
    environment = FactoryEnvironment(LineWalker, max_sessions=4)
    assert isinstance(environment, Environment)
    assert environment.max_sessions == 4
    assert isinstance(environment.open(sample()), EnvSession)


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            3,
            r"environment_factory must be a class, a zero-argument callable or a dict \{name: factory\}, got 3 \(int\)",
        ),
        ("LineWalker", r"must be a class, .* got 'LineWalker' \(str\)"),
        ({}, r"environment_factory is an empty dict"),
        (
            {"walker": LineWalker, "bad": None},
            r"environment_factory\['bad'\] must be a class, .* got None \(NoneType\)",
        ),
        ({1: LineWalker}, r"dict keys must be str names, got 1"),
        (lambda size: LineWalker(), r"must be callable with no arguments: missing a required argument: 'size'"),
    ],
)
def test_bad_factories_are_config_errors(factory, message):
    with pytest.raises(ConfigError, match=message):
        FactoryEnvironment(factory)


def test_bad_max_sessions():
    with pytest.raises(ConfigError, match=r"max_sessions must be a positive int or None, got 0"):
        FactoryEnvironment(LineWalker, max_sessions=0)


async def test_object_is_built_lazily_and_constructor_errors_fail_reset():
    built = []

    def factory():
        built.append(1)
        raise RuntimeError("no GPU for the simulator")

    session = FactoryEnvironment(factory).open(sample())
    assert built == [] and session.handle is None
    with pytest.raises(RuntimeError, match="no GPU for the simulator"):
        await session.reset(sample())
    assert built == [1]
    assert await session.finish() == 0.0  # nothing to ask for a reward
    await session.close()


# --- reset ---


async def test_reset_appends_to_the_last_user_message_and_offers_tools():
    environment = FactoryEnvironment(LineWalker)
    s = sample({"target": 3, "prompt": "ignored"})
    session = environment.open(s)
    reset = await session.reset(s)
    assert isinstance(reset, Reset)
    assert reset.prompt == (
        Message(role="system", content="Be brief."),
        Message(role="user", content="Walk.\n\nYou are at 0. Reach 3."),
    )
    assert [t["function"]["name"] for t in reset.tools] == ["move", "jump"]
    assert reset.tools[0] == {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move one cell.",
            "parameters": {
                "type": "object",
                "properties": {
                    "direction": {"type": "string", "enum": ["left", "right"], "description": "Which way to move."}
                },
                "required": ["direction"],
            },
        },
    }
    assert reset.stop is None
    assert isinstance(session.handle, LineWalker)
    assert session.handle.seen_columns == {"target": 3}  # every column but prompt


async def test_reset_adds_a_user_message_when_the_prompt_does_not_end_with_one():
    s = sample(prompt=("system", "You walk."))
    session = FactoryEnvironment(LineWalker).open(s)
    reset = await session.reset(s)
    assert reset.prompt == (
        Message(role="system", content="You walk."),
        Message(role="user", content="You are at 0. Reach 2."),
    )


async def test_reset_passes_only_the_columns_a_named_signature_accepts():
    row = {"a": 6, "b": 7, "environment": "calc", "prompt": "x", "difficulty": "easy"}
    session = await started(Calculator, row)
    assert (session.handle.a, session.handle.b) == (6, 7)


async def test_reset_missing_a_required_column_names_it():
    session = FactoryEnvironment(Calculator).open(sample({"a": 1}))
    with pytest.raises(
        ConfigError, match=r"reset\(\) needs the column\(s\) b, which the row does not have \(row columns: a\)"
    ):
        await session.reset(sample({"a": 1}))


async def test_no_reset_method_and_none_from_reset_keep_the_prompt():
    for factory in (Silent, AsyncBrowser):
        s = sample()
        reset = await FactoryEnvironment(factory).open(s).reset(s)
        assert reset.prompt == s.prompt


async def test_reset_returning_something_else_is_an_environment_error():
    class Odd:
        def reset(self, **kwargs):
            return {"observation": 1}

    with pytest.raises(
        EnvironmentError_, match=r"Odd.reset\(\) must return a str or None \(or images, alone or with text\), got dict"
    ):
        await started(Odd)


async def test_a_tool_without_type_hints_fails_reset():
    class Untyped:
        def poke(self, where):
            return where

    with pytest.raises(ConfigError, match="parameter where has no type hint"):
        await started(Untyped)


# --- dict of factories ---


async def test_dict_factory_picks_by_environment_column():
    environment = FactoryEnvironment({"walker": LineWalker, "calc": Calculator})
    rows = [{"environment": "calc", "a": 2, "b": 3}, {"environment": "walker", "target": 1}]
    handles = []
    for row in rows:
        session = environment.open(sample(row))
        assert session.name == row["environment"]
        reset = await session.reset(sample(row))
        handles.append(session.handle)
        assert reset.prompt[-1].content.endswith(("Compute 2 * 3.", "You are at 0. Reach 1."))
    assert [type(h) for h in handles] == [Calculator, LineWalker]
    assert handles[1].seen_columns == {"environment": "walker", "target": 1}


def test_dict_factory_errors_name_the_value_and_the_choices():
    environment = FactoryEnvironment({"walker": LineWalker, "calc": Calculator})
    with pytest.raises(
        ConfigError, match=r"the sample has no 'environment' column, .* to pick one of: 'walker', 'calc'"
    ):
        environment.open(sample({"target": 1}))
    with pytest.raises(
        ConfigError, match=r"environment 'chess' \(from the 'environment' column\) is not one of: 'walker', 'calc'"
    ):
        environment.open(sample({"environment": "chess"}))


# --- step ---


async def test_an_answer_without_tool_calls_terminates():
    session = await started(LineWalker)
    assert await session.step(said()) == Step(terminated=True)


async def test_successful_calls_append_tool_messages():
    session = await started(LineWalker, {"target": 5})
    step = await session.step(said(call("move", direction="right"), call("jump", cells=2)))
    assert step == Step(
        messages=(tool_message("You are at 1.", "move"), tool_message("You are at 3.", "jump")),
        reward=0.0,
        terminated=False,
    )


async def test_calls_parsed_from_model_text_run_end_to_end():
    session = await started(LineWalker, {"target": 1})
    text = '<tool_call>\n{"name": "move", "arguments": {"direction": "right"}}\n</tool_call>'
    conversation = said(*get_parser("hermes").parse(text), content=text)
    step = await session.step(conversation)
    assert step.messages == (tool_message("You are at 1.", "move"),)
    assert step.terminated is True
    assert await session.finish() == 1.0


async def test_each_failure_kind_is_reported_to_the_model_and_counted():
    session = await started(LineWalker, {"target": 10})
    broken = get_parser("hermes").parse('<tool_call>{"name": "move" "arguments": {}}</tool_call>')
    step = await session.step(
        said(
            *broken,
            call("fly", height=3),
            call("move"),
            call("move", direction="left", speed=2),
            call("jump", cells="2"),
            call("move", direction="stay"),
            call("jump", cells=4),
            call("move", direction="right"),
        )
    )
    expected = [
        ("tool_invalid_json", "move", "invalid JSON in <tool_call>: Expecting ',' delimiter at char 16"),
        ("tool_unknown", "fly", "unknown tool 'fly'; available tools: move, jump"),
        ("tool_bad_arguments", "move", "invalid arguments for tool move: missing required argument direction"),
        (
            "tool_bad_arguments",
            "move",
            "invalid arguments for tool move: unexpected argument speed (valid arguments: direction)",
        ),
        (
            "tool_bad_arguments",
            "jump",
            'invalid arguments for tool jump: argument cells must be integer but got "2" (str)',
        ),
        (
            "tool_bad_arguments",
            "move",
            'invalid arguments for tool move: argument direction must be one of ["left","right"] but got "stay"',
        ),
        ("tool_raised", "jump", "ValueError: cannot jump 4 cells, at most 3"),
    ]
    assert step.failures == tuple(Failure(kind, message) for kind, _, message in expected)
    assert step.messages == (
        *(tool_message(f"Error: {message}", name) for _, name, message in expected),
        tool_message("You are at 1.", "move"),
    )
    assert step.terminated is False
    assert session.handle.position == 1  # "stay" did not silently move anyone


async def test_offered_tools_are_known_before_an_episode_for_classes():
    import functools

    session = await started(LineWalker)
    reset_tools = (await session.reset(sample())).tools
    assert FactoryEnvironment(LineWalker).offered_tools(sample()) == reset_tools != ()
    assert FactoryEnvironment(functools.partial(LineWalker)).offered_tools(sample()) == reset_tools
    routed = FactoryEnvironment({"walk": LineWalker, "scale": Scaler})
    assert routed.offered_tools(sample({"environment": "walk"})) == reset_tools
    assert [t["function"]["name"] for t in routed.offered_tools(sample({"environment": "scale"}))] == ["scale"]
    assert routed.offered_tools(sample({"environment": ["walk"]})) is None  # refused by check_routes
    assert FactoryEnvironment(lambda: LineWalker()).offered_tools(sample()) is None  # known once built


class Scaler:
    def reset(self, **row) -> str:
        return "Scale."

    def scale(self, factor: float) -> str:
        """Scale.

        Args:
            factor: By how much.
        """
        return f"scaled by {factor}"


async def test_an_integer_too_large_for_a_float_is_the_models_bad_argument():
    # Found by `rollforge bench fuzz`: float(10**400) raised OverflowError, failing the episode as
    # env_error (an infrastructure failure) instead of telling the model.
    session = await started(Scaler)
    text = '<tool_call>\n{"name": "scale", "arguments": {"factor": 1' + "0" * 400 + "}}\n</tool_call>"
    step = await session.step(said(*get_parser("hermes").parse(text), content=text))
    assert [f.kind for f in step.failures] == ["tool_bad_arguments"]
    assert "argument factor must be a finite number within a double's range" in step.failures[0].message
    assert step.messages[0].content.startswith("Error: invalid arguments for tool scale: argument factor")
    assert step.terminated is False


async def test_done_stops_the_remaining_calls_and_terminates():
    session = await started(LineWalker, {"target": 1})
    step = await session.step(said(call("move", direction="right"), call("move", direction="right")))
    assert step == Step(messages=(tool_message("You are at 1.", "move"),), terminated=True)
    assert session.handle.position == 1


class TimedWalker(LineWalker):
    """A LineWalker with a step limit: running out of moves is ``done`` and ``truncated``."""

    def move(self, direction: Literal["left", "right"]) -> str:
        """Move one cell.

        Args:
            direction: Which way to move.
        """
        text = super().move(direction)
        if not self.done and abs(self.position) >= 2:
            self.done = self.truncated = True
        return text


async def test_done_with_truncated_ends_the_episode_truncated_not_terminated():
    session = await started(TimedWalker, {"target": 3})
    step = await session.step(said(call("move", direction="left"), call("move", direction="left")))
    assert step == Step(
        messages=(tool_message("You are at -1.", "move"), tool_message("You are at -2.", "move")), truncated=True
    )
    assert step.ending == "truncated"


async def test_nothing_runs_once_done():
    session = await started(LineWalker)
    session.handle.done = True
    step = await session.step(said(call("move", direction="right")))
    assert step == Step(terminated=True)
    assert session.handle.position == 0


async def test_none_result_is_empty_content():
    session = await started(Silent)
    step = await session.step(said(call("echo", text="hi")))
    assert step.messages == (tool_message("", "echo"),)


class Structured:
    def lookup(self, kind: str) -> object:
        """Return a value of the given kind.

        Args:
            kind: dict, list, number, flag, unicode, object or text.
        """
        return {
            "dict": {"city": "Paris", "ok": True, "none": None},
            "list": [1, 2.5, "three"],
            "number": 42,
            "flag": False,
            "unicode": {"name": "Zoë"},
            "object": {"when": Structured},  # what JSON cannot hold falls back to str
            "text": "plain text stays as it is",
        }[kind]


async def test_non_string_tool_results_are_rendered_as_json():
    session = await started(Structured)
    kinds = ["dict", "list", "number", "flag", "unicode", "object", "text"]
    step = await session.step(said(*(call("lookup", kind=k) for k in kinds)))
    assert [m.content for m in step.messages] == [
        '{"city": "Paris", "ok": true, "none": null}',
        '[1, 2.5, "three"]',
        "42",
        "false",
        '{"name": "Zoë"}',
        '{"when": "' + str(Structured) + '"}',
        "plain text stays as it is",
    ]


async def test_sync_tools_run_on_rollforges_own_worker_threads():
    class Where:
        def thread(self) -> str:
            """Name the thread."""
            return threading.current_thread().name

    step = await (await started(Where)).step(said(call("thread")))
    assert step.messages[0].content.startswith("rollforge-env-")


async def test_images_from_tools_go_to_message_images():
    session = await started(Camera)
    step = await session.step(said(call("snapshot"), call("annotated")))
    single, mixed = step.messages
    assert (single.content, len(single.images)) == ("", 1)
    assert single.images[0].size == (2, 2)
    assert (mixed.content, len(mixed.images)) == ("before\nafter", 2)
    assert mixed.name == "annotated"


async def test_step_needs_a_reset_and_an_assistant_message():
    session = FactoryEnvironment(LineWalker).open(sample())
    with pytest.raises(EnvironmentError_, match=r"step\(\) was called before a successful reset\(\)"):
        await session.step(said())
    await session.reset(sample())
    with pytest.raises(EnvironmentError_, match="needs the conversation to end with an assistant message, not user"):
        await session.step((Message(role="user", content="hi"),))


# --- sync in threads, async on the loop ---


async def test_sync_tools_run_in_a_worker_thread_by_default():
    loop_thread = threading.get_ident()

    class Probe:
        def where(self) -> str:
            """Report the thread."""
            return "loop" if threading.get_ident() == loop_thread else "worker"

    threaded = await started(Probe)
    inline = await started(Probe, run_in_thread=False)
    assert (await threaded.step(said(call("where")))).messages[0].content == "worker"
    assert (await inline.step(said(call("where")))).messages[0].content == "loop"


async def test_async_environment():
    session = await started(AsyncBrowser)
    step = await session.step(said(call("open_page", url="a.com"), call("open_page", url="b.com")))
    assert [m.content for m in step.messages] == ["<html>a.com</html>", "<html>b.com</html>"]
    assert await session.finish() == 1.0
    await session.close()
    assert session.handle.closed is True


# --- finish and close ---


async def test_finish_returns_get_reward_as_float():
    session = await started(Calculator, {"a": 1, "b": 2})
    reward = await session.finish()
    assert reward == 1.0 and type(reward) is float
    walker = await started(LineWalker, {"target": 1})
    assert await walker.finish() == 0.0
    assert await (await started(Silent)).finish() == 0.0  # no get_reward


async def test_finish_rejects_non_numbers():
    class Wordy:
        def get_reward(self):
            return "1.0"

    session = await started(Wordy)
    with pytest.raises(EnvironmentError_, match=r"Wordy.get_reward\(\) must return a finite number, got '1.0'"):
        await session.finish()


async def test_close_calls_the_object_once():
    session = await started(LineWalker)
    await session.close()
    await session.close()
    assert session.handle.closed == 1
    await FactoryEnvironment(LineWalker).open(sample()).close()  # never reset: nothing to close
