"""DeepSeek V3 / R1 / V3.1 tool-call tokens (note the fullwidth ``｜`` and the ``▁`` in them).

- V3 and R1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
  (more calls follow, then ``<｜tool▁calls▁end｜>``);
- V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``.

Which form a call uses is read from the text before ``<｜tool▁sep｜>``: the word ``function``
(the call type) means V3/R1, anything else is the tool name of V3.1. A call ends at
``<｜tool▁call▁end｜>``, at the next call or at the end of the text (generation cut short); the
JSON inside must be one strict JSON object. ``<｜tool▁calls▁begin｜>`` with no call after it is
an error call: the model started to call a tool.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...types import ToolCall
from .decoding import BadJSON, Scanner, arguments_object, broken, decode_prefix, full, only_trailing_special, valid_name
from ._prompt import DONE, dumps, example_arguments, tool_functions, tool_list

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE_OPEN, _FENCE = "```json", "```"


class DeepSeekParser:
    """DeepSeek V3/R1 (``function<｜tool▁sep｜>NAME`` + fenced JSON) and V3.1 (``NAME<｜tool▁sep｜>{json}``)."""

    #: Text whose presence means the reply tried to call a tool.
    markers: tuple[str, ...] = (CALLS_BEGIN, CALL_BEGIN)

    def parse(self, text: str) -> tuple[ToolCall, ...]:
        scan = Scanner(text)
        start = scan.find(CALL_BEGIN, 0)
        if start == -1:
            return (broken(f"{CALLS_BEGIN} is not followed by {CALL_BEGIN}"),) if CALLS_BEGIN in text else ()
        calls: list[ToolCall] = []
        while start != -1 and not full(calls):
            body = start + len(CALL_BEGIN)
            end, closer = scan.first((CALL_END, CALL_BEGIN), body)
            stop = len(text) if end == -1 else end
            calls.append(self._call(scan, body, stop))
            start = scan.find(CALL_BEGIN, stop + (len(CALL_END) if closer == CALL_END else 0))
        return tuple(calls)

    def _call(self, scan: Scanner, start: int, stop: int) -> ToolCall:
        text = scan.text
        sep = scan.find(SEP, start)
        if sep == -1 or sep > stop:
            return broken(f"{CALL_BEGIN} is not followed by NAME{SEP}ARGUMENTS")
        head = text[start:sep].strip()
        if head == "function":  # V3 / R1: the name is the rest of the line, then fenced JSON
            line_end = text.find("\n", sep, stop)
            name_end = stop if line_end == -1 else line_end
            name, args_at = text[sep + len(SEP) : name_end].strip(), name_end
        else:
            name, args_at = head, sep + len(SEP)
        problem = valid_name(name, word=True)
        if problem is not None:
            return broken(f"the tool name in {CALL_BEGIN} {problem}")
        payload = text[args_at:stop].lstrip()
        if payload.startswith(_FENCE_OPEN):
            payload = payload[len(_FENCE_OPEN) :]
        try:
            data, end = decode_prefix(payload)
        except BadJSON as exc:
            return broken(f"invalid JSON in the arguments of tool call {name}: {exc}", name)
        rest = payload[end:].strip()
        fence = next((k for k in range(len(_FENCE), 0, -1) if rest.startswith(_FENCE[:k])), 0)
        rest = rest[fence:]  # the closing fence, or what a cut generation left of it
        if not only_trailing_special(rest, 0, CALL_END):
            return broken(f"tool call {name}: text follows its JSON arguments before {CALL_END}", name)
        arguments = arguments_object(data, "arguments", name)
        return arguments if isinstance(arguments, ToolCall) else ToolCall(name=name, arguments=arguments)

    def write(self, call: ToolCall) -> str:
        """``call`` in the V3/R1 form (``parse`` reads it back)."""
        arguments = dumps(dict(call.arguments))
        return f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}{call.name}\n```json\n{arguments}\n```{CALL_END}{CALLS_END}"

    def system_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        functions = tool_functions(tools)
        if not functions:
            return ""
        first = functions[0]
        example = (
            f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}{first['name']}\n"
            f"{_FENCE_OPEN}\n{dumps(example_arguments(first))}\n{_FENCE}{CALL_END}{CALLS_END}"
        )
        return (
            "You can call the following tools:\n"
            f"{tool_list(functions)}\n\n"
            "To call a tool, write its name and its arguments as a JSON object in exactly this format:\n"
            f"{example}\n"
            f"For several calls, repeat the part from {CALL_BEGIN} to {CALL_END} inside "
            f"{CALLS_BEGIN} ... {CALLS_END}. Each result comes back to you in a tool message. {DONE}"
        )
