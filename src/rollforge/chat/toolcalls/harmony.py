"""GPT-OSS harmony: a tool call is a message addressed ``to=functions.NAME``, ended by ``<|call|>``.

A reply is a sequence of harmony messages, e.g.
``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>commentary
to=functions.get_weather <|constrain|>json<|message|>{"city": "x"}<|call|>``: each has a header
(role, ``<|channel|>``, an optional recipient ``to=...`` written before or after the channel, an
optional content type such as ``<|constrain|>json``), then ``<|message|>`` and a body that ends at
``<|end|>``, ``<|call|>``, ``<|return|>``, the next ``<|start|>`` or the end of the text. Every
message with a recipient is a call: ``functions.NAME`` calls tool NAME, any other recipient (the
built-in ``browser.*`` / ``python`` tools) is passed on as it is, so the environment reports an
unknown tool. Analysis and final messages are not calls. A reply cut inside a call's header
(after ``to=functions.NAME``, before ``<|message|>``) is an error call with that name.

OpenAI's ``openai-harmony`` package parses completions from token ids, and its encoding loader
downloads the o200k vocabulary from the internet on first use (``HarmonyError: error downloading
or loading vocab file`` offline), so it cannot run inside a rollout here; this parser reads the
text itself, in one pass. The tests check it against ``openai_harmony``'s own
``parse_messages_from_completion_tokens`` where an offline build of it is installed (vLLM's CPU
build pulls in ``oss-harmony``, which bundles the vocabulary).
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from ...types import ToolCall
from .decoding import BadJSON, Scanner, arguments_object, broken, decode_prefix, full, only_trailing_special, valid_name
from ._prompt import DONE, dumps, example_arguments, parameters_of, tool_functions

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
_BODY_ENDS = (END, CALL, RETURN, START)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_NAMESPACE = "functions."


class HarmonyParser:
    """Messages addressed ``to=functions.NAME`` on the commentary channel (GPT-OSS)."""

    #: Text whose presence means the reply tried to call a tool.
    markers: tuple[str, ...] = ("to=" + _NAMESPACE, CALL)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        if "to=" not in text:
            return ()
        scan = Scanner(text)
        calls: list[ToolCall] = []
        header = 0
        at = scan.find(MESSAGE, 0)
        while at != -1:
            body = at + len(MESSAGE)
            end, closer = scan.first(_BODY_ENDS, body)
            stop = len(text) if end == -1 else end
            recipient = _RECIPIENT.search(text, header, at)
            if recipient is not None:
                if full(calls):
                    return tuple(calls)
                calls.append(self._call(recipient.group(1), text, body, stop, closer))
            if end == -1:
                return tuple(calls)
            header = stop if closer == START else stop + len(closer)
            at = scan.find(MESSAGE, header)
        cut = _RECIPIENT.search(text, header)
        if cut is not None and "<|" in text[header : cut.start()]:  # a header, not prose saying "to="
            name = _tool_name(cut.group(1))
            if valid_name(name, word=True) is not None:
                name = ""
            calls.append(
                broken(f"tool call {name or '(unnamed)'}: the reply ends before {MESSAGE} and the arguments", name)
            )
        return tuple(calls)

    def _call(self, recipient: str, text: str, body: int, stop: int, closer: str) -> ToolCall:
        name = _tool_name(recipient)
        problem = valid_name(name, word=True)
        if problem is not None:
            return broken(f"the recipient after to= {problem}")
        payload = text[body:stop]
        if not payload.strip():
            return ToolCall(name=name, arguments={})
        try:
            data, end = decode_prefix(payload)
        except BadJSON as exc:
            return broken(f"invalid JSON in the arguments of tool call {name}: {exc}", name)
        if not only_trailing_special(payload, end, "" if closer else CALL):
            return broken(f"tool call {name}: text follows its JSON arguments before {CALL}", name)
        arguments = arguments_object(data, "arguments", name)
        return arguments if isinstance(arguments, ToolCall) else ToolCall(name=name, arguments=arguments)

    def write(self, call: ToolCall) -> str:
        """``call`` as a commentary message addressed to the function (``parse`` reads it back)."""
        return f"{CHANNEL}commentary to={_NAMESPACE}{call.name} {CONSTRAIN}json{MESSAGE}{dumps(dict(call.arguments))}{CALL}"

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        """The tools as harmony declares them in the developer message (a TypeScript namespace),
        then how to call one."""
        functions = tool_functions(tools)
        if not functions:
            return ""
        lines = ["# Tools", "", "## functions", "", "namespace functions {", ""]
        for function in functions:
            lines += [f"// {line}" for line in (function.get("description") or "").splitlines()]
            properties = parameters_of(function).get("properties") or {}
            required = set(parameters_of(function).get("required") or ())
            lines.append(f"type {function['name']} = (_: {{")
            for key, schema in properties.items():
                lines += [f"// {line}" for line in (schema.get("description") or "").splitlines()]
                default = f" // default: {dumps(schema['default'])}" if "default" in schema else ""
                optional = "" if key in required else "?"
                lines.append(f"{key}{optional}: {_typescript(schema)},{default}")
            lines += ["}) => any;", ""]
        lines.append("} // namespace functions")
        first = functions[0]
        example = (
            f"{CHANNEL}commentary to={_NAMESPACE}{first['name']} {CONSTRAIN}json{MESSAGE}"
            f"{dumps(example_arguments(first))}{CALL}"
        )
        return (
            "\n".join(lines) + "\n\n"
            "To call a tool, send a message on the commentary channel addressed to it, with its "
            f"arguments as a JSON object, exactly like this:\n{example}\n"
            f"Each result comes back to you in a tool message. {DONE}"
        )


def _tool_name(recipient: str) -> str:
    return recipient[len(_NAMESPACE) :] if recipient.startswith(_NAMESPACE) else recipient


def _typescript(schema: Mapping[str, Any]) -> str:
    """The TypeScript type harmony writes for a JSON-schema parameter."""
    if schema.get("enum"):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if schema.get("anyOf"):
        return " | ".join(_typescript(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_typescript({**schema, "type": k}) for k in kind)
    if kind == "array":
        items = schema.get("items")
        return f"{_typescript(items)}[]" if isinstance(items, Mapping) and items else "any[]"
    return {
        "string": "string",
        "integer": "number",
        "number": "number",
        "boolean": "boolean",
        "null": "null",
        "object": "object",
    }.get(kind, "any")
