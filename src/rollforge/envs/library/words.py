"""Common five-letter English words: the answers and the allowed guesses of ``wordle``, and the
words ``echo`` asks for.

The list is package data, ``words.txt`` beside this module (one word a line), so that the
environments need no download; it is read once, at import. Lower case, no duplicates, sorted; a
test checks all three.
"""

from __future__ import annotations

from importlib import resources

WORDS: tuple[str, ...] = tuple(resources.files(__package__).joinpath("words.txt").read_text(encoding="ascii").split())

WORD_SET: frozenset[str] = frozenset(WORDS)
