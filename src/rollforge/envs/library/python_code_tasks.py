"""The ``python_code`` task set: small functions, each with a reference solution and hidden tests.

A task is a function name, a signature, a one-paragraph description shown to the model, and the
argument tuples of its hidden tests. Expected outputs are never written by hand: they are the
reference solution's outputs (``expected_outputs``), so the table cannot disagree with itself, and
the tests check that every reference passes its own hidden tests inside the sandbox. Outputs are
plain JSON values (str, int, bool, None, lists, dicts with str keys), compared after a JSON round
trip.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CodeTask:
    """One function to write. ``tests`` holds argument lists; the reference gives the outputs."""

    name: str
    signature: str
    description: str
    reference: str
    tests: tuple[tuple[Any, ...], ...]

    def prompt(self) -> str:
        return f"Write a Python function `{self.signature}`.\n\n{self.description}"


def _task(signature: str, description: str, reference: str, *tests: tuple[Any, ...]) -> CodeTask:
    return CodeTask(signature.split("(")[0], signature, description, reference.strip() + "\n", tests)


TASKS: tuple[CodeTask, ...] = (
    _task("reverse_words(s: str) -> str", "Return the words of `s` in reverse order, separated by single spaces.",
          "def reverse_words(s):\n    return ' '.join(reversed(s.split()))",
          ("hello world",), ("  a  b c ",), ("one",), ("",)),
    _task("is_palindrome(s: str) -> bool", "Return True if `s` reads the same backwards, ignoring case and every character that is not a letter or digit.",
          "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
          ("A man, a plan, a canal: Panama",), ("race a car",), ("",), ("No 'x' in Nixon",), ("ab",)),
    _task("count_vowels(s: str) -> int", "Return how many vowels (a, e, i, o, u, either case) `s` contains.",
          "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)",
          ("hello",), ("AEIOU xyz",), ("",), ("rhythm",)),
    _task("fizzbuzz(n: int) -> list[str]", "Return the list for 1..n where multiples of 3 are 'Fizz', of 5 'Buzz', of both 'FizzBuzz', and other numbers their decimal string.",
          "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, n + 1)]",
          (15,), (1,), (0,), (5,)),
    _task("running_sum(nums: list[int]) -> list[int]", "Return the list whose i-th element is the sum of nums[0..i].",
          "def running_sum(nums):\n    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out",
          ([1, 2, 3, 4],), ([],), ([5, -5, 5],)),
    _task("second_largest(nums: list[int]) -> int | None", "Return the second largest distinct value in `nums`, or None when there are fewer than two distinct values.",
          "def second_largest(nums):\n    values = sorted(set(nums))\n    return values[-2] if len(values) >= 2 else None",
          ([3, 1, 4, 1, 5],), ([2, 2],), ([],), ([-1, -7, -3],)),
    _task("flatten(items: list) -> list", "Flatten arbitrarily nested lists into one list of the non-list items, in order.",
          "def flatten(items):\n    out = []\n    for x in items:\n        out.extend(flatten(x) if isinstance(x, list) else [x])\n    return out",
          ([1, [2, [3, [4]]], 5],), ([],), ([[], [[]]],), (["a", ["b"]],)),
    _task("dedupe(items: list) -> list", "Return `items` without repeated values, keeping the first occurrence of each, in order.",
          "def dedupe(items):\n    seen, out = set(), []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out",
          ([1, 2, 1, 3, 2],), ([],), (["b", "a", "b"],)),
    _task("caesar(s: str, k: int) -> str", "Shift every ASCII letter of `s` by `k` places in the alphabet (wrapping around, keeping case); leave other characters unchanged. `k` may be negative.",
          "def caesar(s, k):\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n            out.append(chr((ord(c) - 97 + k) % 26 + 97))\n        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + k) % 26 + 65))\n        else:\n            out.append(c)\n    return ''.join(out)",
          ("abc xyz", 3), ("Hello, World!", 13), ("abc", -1), ("", 5)),
    _task("run_length(s: str) -> str", "Run-length encode `s`: each run of a repeated character becomes the character followed by the run's length, e.g. 'aaab' -> 'a3b1'.",
          "def run_length(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)",
          ("aaab",), ("",), ("abc",), ("zzzzzzzzzzzz",)),
    _task("are_anagrams(a: str, b: str) -> bool", "Return True if `a` and `b` contain the same letters the same number of times, ignoring case and spaces.",
          "def are_anagrams(a, b):\n    norm = lambda s: sorted(s.replace(' ', '').lower())\n    return norm(a) == norm(b)",
          ("Listen", "Silent"), ("abc", "abd"), ("a gentleman", "elegant man"), ("", "")),
    _task("digit_sum(n: int) -> int", "Return the sum of the decimal digits of `n` (of its absolute value when negative).",
          "def digit_sum(n):\n    return sum(int(c) for c in str(abs(n)))",
          (12345,), (0,), (-907,)),
    _task("chunk(items: list, size: int) -> list[list]", "Split `items` into consecutive chunks of `size` items; the last chunk may be shorter.",
          "def chunk(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]",
          ([1, 2, 3, 4, 5], 2), ([], 3), ([1, 2, 3], 3), ([1], 5)),
    _task("max_profit(prices: list[int]) -> int", "Given daily prices, return the largest profit from buying on one day and selling on a later day, or 0 if no profit is possible.",
          "def max_profit(prices):\n    best, low = 0, None\n    for p in prices:\n        low = p if low is None else min(low, p)\n        best = max(best, p - low)\n    return best",
          ([7, 1, 5, 3, 6, 4],), ([7, 6, 4, 3, 1],), ([],), ([2, 4, 1, 10],)),
    _task("merge_sorted(a: list[int], b: list[int]) -> list[int]", "Merge two sorted lists into one sorted list.",
          "def merge_sorted(a, b):\n    return sorted(a + b)",
          ([1, 3, 5], [2, 4, 6]), ([], [1]), ([1, 1], [1]), ([-3, 0], [])),
    _task("word_counts(s: str) -> dict[str, int]", "Count the words of `s` (split on whitespace, lowercased) and return a dict from word to count.",
          "def word_counts(s):\n    out = {}\n    for w in s.lower().split():\n        out[w] = out.get(w, 0) + 1\n    return out",
          ("the cat The dog",), ("",), ("a a a",)),
    _task("rotate(items: list, k: int) -> list", "Rotate `items` right by `k` places (k may exceed the length; an empty list stays empty).",
          "def rotate(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[-k:] + items[:-k] if k else list(items)",
          ([1, 2, 3, 4, 5], 2), ([1, 2, 3], 3), ([], 4), ([1, 2], 5)),
    _task("is_prime(n: int) -> bool", "Return True if `n` is a prime number.",
          "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True",
          (2,), (1,), (97,), (91,), (-7,), (7919,)),
    _task("to_binary(n: int) -> str", "Return the binary representation of the non-negative integer `n` without a prefix, e.g. 5 -> '101'.",
          "def to_binary(n):\n    return bin(n)[2:]",
          (5,), (0,), (1024,), (255,)),
    _task("transpose(matrix: list[list[int]]) -> list[list[int]]", "Return the transpose of a rectangular matrix given as a list of rows.",
          "def transpose(matrix):\n    return [list(col) for col in zip(*matrix)]",
          ([[1, 2, 3], [4, 5, 6]],), ([[1]],), ([],)),
)

TASKS_BY_NAME: dict[str, CodeTask] = {task.name: task for task in TASKS}


@functools.lru_cache(maxsize=None)
def expected_outputs(name: str) -> tuple[str, ...]:
    """The reference solution's outputs for each hidden test, as canonical JSON text."""
    task = TASKS_BY_NAME[name]
    namespace: dict[str, Any] = {}
    exec(compile(task.reference, f"<reference {name}>", "exec"), namespace)  # trusted, bundled source
    function = namespace[name]
    return tuple(canonical(function(*json.loads(json.dumps(args)))) for args in task.tests)


def canonical(value: Any) -> str:
    """A JSON value as comparable text (dict keys sorted)."""
    return json.dumps(value, sort_keys=True)
