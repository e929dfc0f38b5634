"""Pieces of the fallback system prompts (for chat templates that ignore ``tools=``).

Each family's prompt lists the tools, shows the family's exact call format with an example built
from the first tool's required parameters, and ends with ``DONE``.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ...errors import ConfigError

DONE = "When you are done, answer without a tool call."


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Accept tools in the OpenAI format (``{"type": "function", "function": {...}}``) or bare."""
    functions = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ConfigError(f"a tool schema needs a function name, got {tool!r}")
        functions.append(function)
    return functions


def parameters_of(function: Mapping[str, Any]) -> Mapping[str, Any]:
    return function.get("parameters") or {"type": "object", "properties": {}, "required": []}


def tool_list(functions: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for function in functions:
        description = function.get("description") or "(no description)"
        lines.append(f"- {function['name']}: {description}")
        lines.append(f"  parameters: {dumps(parameters_of(function))}")
    return "\n".join(lines)


def example_value(schema: Mapping[str, Any]) -> Any:
    """A plausible value for a parameter schema, for the example call in the system prompt."""
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("anyOf"):
        return example_value(schema["anyOf"][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(kind, "...")


def example_arguments(function: Mapping[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or list(properties)[:1]
    return {name: example_value(properties.get(name, {})) for name in required}
