"""One ``python_code`` task as a value (``CodeTask``), and ``code_task``, which builds one from a row
of the task tables (``python_code_text_tasks``, ``python_code_list_tasks``).

A row is a signature, a description shown to the model, a reference solution and the hidden tests,
written as calls (argument tuples) taken two by two: a test passes when the submitted function
returns the reference's outputs for both of its calls (``python_code_tasks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: One call's arguments.
Call = tuple[Any, ...]


@dataclass(frozen=True)
class CodeTask:
    """One function to write. ``tests`` holds pairs of calls; the reference gives the outputs."""

    name: str
    signature: str
    description: str
    reference: str
    tests: tuple[tuple[Call, ...], ...]

    def prompt(self) -> str:
        return f"Write a Python function `{self.signature}`.\n\n{self.description}"


def code_task(signature: str, description: str, reference: str, *calls: Call) -> CodeTask:
    """The task of a table row: its name is the signature's; the calls pair up, in order, into tests."""
    if len(calls) % 2:
        raise ValueError(f"{signature}: hidden tests are pairs of calls, got {len(calls)} calls")
    tests = tuple(zip(calls[::2], calls[1::2]))
    return CodeTask(signature.split("(")[0], signature, description, reference.strip() + "\n", tests)
