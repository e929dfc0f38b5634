"""Tool discovery, JSON schemas and argument validation (rollforge.envs.tools)."""

from __future__ import annotations

import enum
from typing import Any, Literal, Optional

import pytest

from rollforge.errors import ConfigError, ToolArgumentError
from rollforge.envs.tools import (
    Tool,
    discover_tools,
    parse_docstring,
    tool_from_callable,
    validate_arguments,
)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class GridEnv:
    """Written the way a TRL user writes an environment class."""

    def __init__(self):
        self.done = False
        self.position = 0

    def reset(self, **kwargs) -> str | None:
        self.position = 0
        return "You are at 0."

    def get_reward(self) -> float:
        return float(self.position)

    def close(self) -> None:
        pass

    @property
    def score(self) -> int:
        raise AssertionError("discovery must not evaluate properties")

    def move(self, direction: Literal["left", "right"], steps: int = 1) -> str:
        """Move the player along the line.

        The line is infinite.

        Args:
            direction: Which way to go.
            steps (int): How many cells to move,
                between 1 and 3.

        Returns:
            The new position.
        """
        self.position += steps if direction == "right" else -steps
        return f"position {self.position}"

    def paint(self, color: Color, level: Level = Level.LOW, note: Optional[str] = None) -> str:
        """Paint the current cell."""
        return f"{color.name} {level.name} {note}"

    def _helper(self) -> None:
        """Private: never a tool."""

    @staticmethod
    def ping() -> str:
        """Check the connection."""
        return "pong"


def test_discovery_finds_public_methods_only_in_definition_order():
    tools = discover_tools(GridEnv())
    assert list(tools) == ["move", "paint", "ping"]
    assert all(isinstance(t, Tool) for t in tools.values())
    assert tools["ping"].function() == "pong"


def test_schema_from_hints_and_google_docstring():
    move = discover_tools(GridEnv())["move"]
    assert move.schema() == {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move the player along the line.\n\nThe line is infinite.",
            "parameters": {
                "type": "object",
                "properties": {
                    "direction": {"type": "string", "enum": ["left", "right"], "description": "Which way to go."},
                    "steps": {
                        "type": "integer",
                        "description": "How many cells to move, between 1 and 3.",
                        "default": 1,
                    },
                },
                "required": ["direction"],
            },
        },
    }


def test_schema_of_enums_and_optional():
    paint = discover_tools(GridEnv())["paint"]
    assert paint.parameters == {
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red", "blue"]},
            "level": {"type": "integer", "enum": [1, 2], "default": 1},
            "note": {"type": "string", "nullable": True, "default": None},
        },
        "required": ["color"],
    }


def test_nested_types_schema():
    def plan(
        moves: list[Literal["up", "down"]],
        weights: dict[str, float],
        grid: list[list[int]] | None,
        anything: Any = 3,
        mixed: int | str = 0,
        flags: list = [],  # noqa: B006 - the default is only read
        lookup: dict = {},  # noqa: B006
    ) -> None:
        """Plan moves."""

    tool = tool_from_callable(plan)
    assert tool.name == "plan"
    assert tool.parameters["properties"] == {
        "moves": {"type": "array", "items": {"type": "string", "enum": ["up", "down"]}},
        "weights": {"type": "object", "additionalProperties": {"type": "number"}},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}, "nullable": True},
        "anything": {"default": 3},
        "mixed": {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 0},
        "flags": {"type": "array", "default": []},
        "lookup": {"type": "object", "default": {}},
    }
    assert tool.parameters["required"] == ["moves", "weights", "grid"]


def test_none_default_makes_a_parameter_nullable():
    def look(target: str = None) -> str:  # type: ignore[assignment]
        """Look."""

    tool = tool_from_callable(look)
    assert tool.parameters["properties"]["target"] == {"type": "string", "nullable": True, "default": None}
    assert validate_arguments(tool, {"target": None}) == {"target": None}


def test_schema_is_a_copy():
    move = discover_tools(GridEnv())["move"]
    move.schema()["function"]["parameters"]["required"].append("oops")
    assert move.parameters["required"] == ["direction"]


def test_missing_type_hint_is_a_config_error_naming_method_and_parameter():
    class Env:
        def jump(self, height) -> str:
            return "up"

    with pytest.raises(ConfigError, match=r"tool .*Env\.jump, parameter height has no type hint"):
        discover_tools(Env())


@pytest.mark.parametrize(
    "source, message",
    [
        ("def f(*moves: str): ...", r"parameter moves: \*args and \*\*kwargs"),
        ("def f(**options: str): ...", r"parameter options: \*args and \*\*kwargs"),
        ("def f(x: int, /): ...", r"parameter x: positional-only"),
        ("def f(x: set[int]): ...", r"parameter x: unsupported type hint"),
        ("def f(x: dict[int, str]): ...", r"parameter x: dict keys must be str"),
        ("def f(x: 'Missing'): ...", r"cannot resolve the type hints of tool f"),
    ],
)
def test_unsupported_signatures(source, message):
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(ConfigError, match=message):
        tool_from_callable(namespace["f"])


def test_parse_docstring():
    doc = """Summary line
    continues here.

    Args:
        a (int): first
            more about a.
        b: second

    Raises:
        ValueError: never
    """
    assert parse_docstring(doc) == ("Summary line continues here.", {"a": "first more about a.", "b": "second"})
    assert parse_docstring(None) == ("", {})


# --- validation ---


@pytest.fixture
def move() -> Tool:
    return discover_tools(GridEnv())["move"]


def test_valid_arguments_pass_through(move):
    assert validate_arguments(move, {"direction": "left"}) == {"direction": "left"}
    assert validate_arguments(move, {"direction": "right", "steps": 2}) == {"direction": "right", "steps": 2}


def test_literal_rejects_stay(move):
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(move, {"direction": "stay"})
    assert (
        str(info.value)
        == 'invalid arguments for tool move: argument direction must be one of ["left","right"] but got "stay"'
    )
    assert info.value.tool == "move"
    assert isinstance(info.value, ConfigError)


def test_missing_and_mistyped_are_all_reported(move):
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(move, {"steps": "3"})
    assert info.value.problems == (
        "missing required argument direction",
        'argument steps must be integer but got "3" (str)',
    )


def test_unexpected_arguments_list_the_valid_ones(move):
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(move, {"direction": "left", "speed": 2})
    assert info.value.problems == ("unexpected argument speed (valid arguments: direction, steps)",)


def test_no_arguments_tool_rejects_any():
    tool = discover_tools(GridEnv())["ping"]
    assert validate_arguments(tool, {}) == {}
    with pytest.raises(
        ToolArgumentError, match=r"unexpected arguments a, b \(valid arguments: none, this tool takes no arguments\)"
    ):
        validate_arguments(tool, {"a": 1, "b": 2})


def test_arguments_must_be_an_object(move):
    with pytest.raises(ToolArgumentError, match=r"arguments must be a JSON object but got \[1\] \(list\)"):
        validate_arguments(move, [1])  # type: ignore[arg-type]


def test_strict_scalars():
    def f(i: int, x: float, b: bool, s: str) -> None: ...

    tool = tool_from_callable(f)
    ok = validate_arguments(tool, {"i": 3, "x": 2, "b": False, "s": ""})
    assert ok == {"i": 3, "x": 2.0, "b": False, "s": ""}
    assert type(ok["x"]) is float  # int widened to float
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(tool, {"i": True, "x": "2.5", "b": 1, "s": 5})
    assert info.value.problems == (
        "argument i must be integer but got true (bool)",
        'argument x must be number but got "2.5" (str)',
        "argument b must be boolean but got 1 (int)",
        "argument s must be string but got 5 (int)",
    )
    with pytest.raises(ToolArgumentError, match=r"argument x must be number but got true \(bool\)"):
        validate_arguments(tool, {"i": 1, "x": True, "b": True, "s": "a"})


def test_numbers_a_double_cannot_hold_are_bad_arguments():
    # float(10**400) raises OverflowError: it used to escape validation as an environment error.
    def scale(x: float, y: float | None = None, weights: dict[str, float] | None = None) -> None: ...

    tool = tool_from_callable(scale)
    huge = 10**400
    assert validate_arguments(tool, {"x": 10**300}) == {"x": 1e300}  # large but in range: converted
    with pytest.raises(ToolArgumentError, match=r"argument y must be .* but got -Infinity \(float\)"):
        validate_arguments(tool, {"x": 1, "y": float("-inf")})
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(tool, {"x": huge, "y": float("nan"), "weights": {"a": 1, "b": -huge}})
    shown = str(huge)[:77] + "..."
    within = "a finite number within a double's range (about ±1.8e308)"
    assert info.value.problems == (
        f"argument x must be {within} but got {shown} (int)",
        f"argument y must be {within} but got NaN (float)",
        f'argument weights["b"] must be {within} but got -{shown[:-4]}... (int)',
    )


def test_a_value_too_large_to_print_is_still_reported():
    import sys

    if not hasattr(sys, "set_int_max_str_digits"):
        pytest.skip("Python without an int digit limit")

    def pick(name: str) -> None: ...

    with pytest.raises(
        ToolArgumentError, match=r"argument name must be string but got <int too large to show> \(int\)"
    ):
        validate_arguments(tool_from_callable(pick), {"name": 10**5000})


def test_enum_converts_back_to_members():
    paint = discover_tools(GridEnv())["paint"]
    assert validate_arguments(paint, {"color": "blue", "level": 2}) == {"color": Color.BLUE, "level": Level.HIGH}
    assert validate_arguments(paint, {"color": Color.RED}) == {"color": Color.RED}
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(paint, {"color": "green", "level": True, "note": 3})
    assert info.value.problems == (
        'argument color must be one of ["red","blue"] but got "green"',
        "argument level must be one of [1,2] but got true",
        "argument note must be string but got 3 (int)",
    )


def test_nested_values_are_checked_with_a_path():
    def plan(moves: list[Literal["up", "down"]], weights: dict[str, float], grid: list[list[int]] | None) -> None: ...

    tool = tool_from_callable(plan)
    assert validate_arguments(tool, {"moves": ["up"], "weights": {"a": 1}, "grid": None}) == {
        "moves": ["up"],
        "weights": {"a": 1.0},
        "grid": None,
    }
    with pytest.raises(ToolArgumentError) as info:
        validate_arguments(tool, {"moves": ["up", "left"], "weights": {"a": "x"}, "grid": [[1], [2, 2.5]]})
    assert info.value.problems == (
        'argument moves[1] must be one of ["up","down"] but got "left"',
        'argument weights["a"] must be number but got "x" (str)',
        "argument grid[1][1] must be integer but got 2.5 (float)",
    )
    with pytest.raises(
        ToolArgumentError, match=r"argument moves must be array of one of \[\"up\",\"down\"\] but got \"up\" \(str\)"
    ):
        validate_arguments(tool, {"moves": "up", "weights": {}, "grid": None})


def test_union_tries_options_in_order():
    def f(v: int | str) -> None: ...

    tool = tool_from_callable(f)
    assert validate_arguments(tool, {"v": 3}) == {"v": 3}
    assert validate_arguments(tool, {"v": "3"}) == {"v": "3"}
    with pytest.raises(ToolArgumentError, match=r"argument v must be integer or string but got 1.5 \(float\)"):
        validate_arguments(tool, {"v": 1.5})


def test_async_tools_are_flagged():
    class Env:
        async def fetch(self, url: str) -> str:
            """Fetch a page."""
            return url

        def local(self) -> str:
            return ""

    tools = discover_tools(Env())
    assert tools["fetch"].is_async is True
    assert tools["local"].is_async is False
