"""Google-style docstrings split into a tool's description and its per-argument descriptions.

Design: a single pass over the cleaned lines. Text before the first section header (``Name:`` on a
line of its own) is the description, paragraphs kept and each one's lines joined; in an ``Args:``
section (or ``Arguments``, ``Parameters``, ``Params``) a line at the entries' indent starting with
``name:`` or ``name (type):`` opens an entry and deeper lines continue it. Every other section is
skipped, and a docstring that does not follow the style still yields its text as the description.
"""

from __future__ import annotations

import inspect
import re

_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_ARG_SECTIONS = {"Args", "Arguments", "Parameters", "Params"}


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description (the text before the first section,
    paragraphs kept) and the per-argument descriptions of its ``Args:`` section."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, entry_indent, current = header.group(1), None, None
            continue
        if section is None:
            summary.append(line.strip())
            continue
        if section not in _ARG_SECTIONS or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if entry_indent is None:
            entry_indent = indent
        entry = _ARG_LINE.match(line.strip()) if indent <= entry_indent else None
        if entry:
            current = entry.group(1)
            args[current] = entry.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    paragraphs = re.split(r"\n\s*\n", "\n".join(summary))
    description = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    return description, args
