"""The ``python_code`` task set: small functions, each with a reference solution and hidden tests.

A task is a function name, a signature, a one-paragraph description shown to the model, and its
hidden tests. A hidden test is a pair of calls (argument lists); it passes when the submitted
function returns the expected value for both. The pairs are chosen so that no answer that ignores
the task passes any of them: each pair mixes outputs (a True case with a False one, an empty
result with a full one) and holds a call whose output is not its input. ``trivial_scores`` plays
those answers (``TRIVIAL_ANSWERS``: constants, the input itself) against every task; the best of
them scores 0.0 on every task, and ``check_env`` reports it (it fails above 0.1).

Expected outputs are never written by hand: they are the reference solution's outputs
(``expected_outputs``), so the table cannot disagree with itself, and the tests check that every
reference passes its own hidden tests inside the sandbox. Outputs are plain JSON values (str, int,
bool, None, lists, dicts with str keys), compared after a JSON round trip.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Callable

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


def _task(signature: str, description: str, reference: str, *calls: Call) -> CodeTask:
    if len(calls) % 2:
        raise ValueError(f"{signature}: hidden tests are pairs of calls, got {len(calls)} calls")
    tests = tuple(zip(calls[::2], calls[1::2]))
    return CodeTask(signature.split("(")[0], signature, description, reference.strip() + "\n", tests)


TASKS: tuple[CodeTask, ...] = (
    _task("reverse_words(s: str) -> str", "Return the words of `s` in reverse order, separated by single spaces.",
          "def reverse_words(s):\n    return ' '.join(reversed(s.split()))",
          ("hello world",), ("one",), ("  a  b c ",), ("",), ("the quick brown fox",), ("x y",),
          ("  leading",), ("trailing  ",), ("p\tq\nr",), ("1 2 3 4 5",), ("Hello, World!",), ("a b a",),
          ("one two",), ("two one",), ("many   spaces   here",), ("z",), ("a b c d e f",), ("end. the",),
          ("  ",), ("racecar level",)),
    _task("is_palindrome(s: str) -> bool", "Return True if `s` reads the same backwards, ignoring case and every character that is not a letter or digit.",
          "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]",
          ("A man, a plan, a canal: Panama",), ("race a car",), ("",), ("ab",), ("No 'x' in Nixon",), ("abca",),
          ("Was it a car or a cat I saw?",), ("hello",), ("12321",), ("12345",), ("abc",), ("a",),
          ("Able was I, ere I saw Elba",), ("Palindrome",), ("0P",), ("aa",), ("Step on no pets!",),
          ("Step on no pet",), ("Madam, in Eden, I'm Adam",), ("madam x",)),
    _task("count_vowels(s: str) -> int", "Return how many vowels (a, e, i, o, u, either case) `s` contains.",
          "def count_vowels(s):\n    return sum(c in 'aeiouAEIOU' for c in s)",
          ("hello",), ("AEIOU xyz",), ("",), ("a",), ("rhythm",), ("queue",), ("Programming in Python",), ("xyz",),
          ("AaEeIiOoUu",), ("bcd",), ("The quick brown fox",), ("sky",), ("aaaaaaa",), ("B",), ("Hello World",),
          ("zzz e",), ("Université",), ("oo",), ("12345 !?",), ("Ai",)),
    _task("fizzbuzz(n: int) -> list[str]", "Return the list for 1..n where multiples of 3 are 'Fizz', of 5 'Buzz', of both 'FizzBuzz', and other numbers their decimal string.",
          "def fizzbuzz(n):\n    return ['FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else str(i) for i in range(1, n + 1)]",
          (15,), (1,), (0,), (5,), (3,), (30,), (2,), (10,), (6,), (4,), (16,), (9,), (7,), (20,), (11,), (12,),
          (25,), (8,), (13,), (14,)),
    _task("running_sum(nums: list[int]) -> list[int]", "Return the list whose i-th element is the sum of nums[0..i].",
          "def running_sum(nums):\n    out, total = [], 0\n    for x in nums:\n        total += x\n        out.append(total)\n    return out",
          ([1, 2, 3, 4],), ([],), ([5, -5, 5],), ([0],), ([10],), ([1, 1, 1, 1],), ([-1, -2, -3],), ([0, 0, 0],),
          ([100, -50, 25],), ([3],), ([2, 2],), ([7, -7],), ([1, -1, 1, -1],), ([9, 8, 7],), ([0, 5],),
          ([-10, 10, -10],), ([1, 2, 4, 8, 16],), ([6],), ([4, 0, 4],), ([1, 3],)),
    _task("second_largest(nums: list[int]) -> int | None", "Return the second largest distinct value in `nums`, or None when there are fewer than two distinct values.",
          "def second_largest(nums):\n    values = sorted(set(nums))\n    return values[-2] if len(values) >= 2 else None",
          ([3, 1, 4, 1, 5],), ([2, 2],), ([],), ([-1, -7, -3],), ([1, 2],), ([5],), ([10, 10, 9],), ([0, -1],),
          ([7, 3, 7, 3],), ([100, 50, 75],), ([1, 1, 1, 2],), ([-5, -5],), ([2, 3],), ([9, 8, 7, 6],),
          ([0, 0, 1],), ([42],), ([6, 6, 5, 5, 4],), ([-2, -1],), ([1000, 999],), ([3, 3, 3, 1],)),
    _task("flatten(items: list) -> list", "Flatten arbitrarily nested lists into one list of the non-list items, in order.",
          "def flatten(items):\n    out = []\n    for x in items:\n        out.extend(flatten(x) if isinstance(x, list) else [x])\n    return out",
          ([1, [2, [3, [4]]], 5],), ([],), ([[], [[]]],), (["a", ["b"]],), ([[1, 2], [3]],), ([1, 2],),
          ([[[["deep"]]]],), ([0, [0]],), ([[1], [], [2, [3, []]]],), ([None, [True]],), ([["x", "y"], "z"],),
          ([[[]], 1],), ([1, [2], [[3]], [[[4]]]],), ([[5, 6], 7],), ([[0]],), ([["a"], ["b"], ["c"]],),
          ([[1, [2]], [3, [4, [5, [6]]]]],), ([9],), ([[-1, -2], [-3]],), ([[[[]]], [2]],)),
    _task("dedupe(items: list) -> list", "Return `items` without repeated values, keeping the first occurrence of each, in order.",
          "def dedupe(items):\n    seen, out = set(), []\n    for x in items:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out",
          ([1, 2, 1, 3, 2],), ([],), (["b", "a", "b"],), ([1],), ([5, 5, 5, 5],), ([1, 2, 3],), ([3, 1, 3, 1, 2],),
          (["x", "x"],), ([9, 8, 9, 7, 8],), (["a", "b", "a", "c"],), ([2, 2, 1, 1],), ([4, 3, 4],),
          ([10, 20, 10, 30, 20, 40],), ([7, 7],), ([-1, 1, -1],), (["q"],), ([1, 1, 2, 2, 3, 3],), ([6, 5, 6, 5],),
          ([0, 0, 1, 0],), ([8, 9],)),
    _task("caesar(s: str, k: int) -> str", "Shift every ASCII letter of `s` by `k` places in the alphabet (wrapping around, keeping case); leave other characters unchanged. `k` may be negative.",
          "def caesar(s, k):\n    out = []\n    for c in s:\n        if 'a' <= c <= 'z':\n            out.append(chr((ord(c) - 97 + k) % 26 + 97))\n        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + k) % 26 + 65))\n        else:\n            out.append(c)\n    return ''.join(out)",
          ("abc xyz", 3), ("Hello, World!", 13), ("abc", -1), ("", 5), ("Zebra", 1), ("abc", 26),
          ("Python 3.11", 5), ("xyz", -3), ("AbC", 52), ("hello", 100), ("Shift Me", -13), ("a", 25),
          ("The End.", 7), ("q", 0), ("MiXeD CaSe", 2), ("!?", 4), ("abcdefghijklmnopqrstuvwxyz", 1), ("Z", -1),
          ("attack at dawn", -5), ("ROT", 13)),
    _task("run_length(s: str) -> str", "Run-length encode `s`: each run of a repeated character becomes the character followed by the run's length, e.g. 'aaab' -> 'a3b1'.",
          "def run_length(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)",
          ("aaab",), ("",), ("abc",), ("zzzzzzzzzzzz",), ("aabbaa",), ("x",), ("  ",), ("112233",), ("abcccd",),
          ("aaaaaaaaaaab",), ("AaA",), ("mississippi",), ("ab",), ("wwwwaaadexxxxxx",), ("q",), ("zzz",),
          ("hello",), ("!!!??",), ("ba",), ("aab",)),
    _task("are_anagrams(a: str, b: str) -> bool", "Return True if `a` and `b` contain the same letters the same number of times, ignoring case and spaces.",
          "def are_anagrams(a, b):\n    norm = lambda s: sorted(s.replace(' ', '').lower())\n    return norm(a) == norm(b)",
          ("Listen", "Silent"), ("abc", "abd"), ("a gentleman", "elegant man"), ("aa", "a"), ("", ""), ("ab", ""),
          ("Dormitory", "dirty room"), ("hello", "world"), ("abc", "cab"), ("abc", "abcc"),
          ("Astronomer", "Moon starer"), ("rat", "car"), ("x", "y"), ("The eyes", "They see"),
          ("Conversation", "Voices rant on"), ("night", "thingy"), ("aab", "abb"), ("School master", "The classroom"),
          ("Funeral", "Real fun"), ("abcd", "dcbaa")),
    _task("digit_sum(n: int) -> int", "Return the sum of the decimal digits of `n` (of its absolute value when negative).",
          "def digit_sum(n):\n    return sum(int(c) for c in str(abs(n)))",
          (12345,), (0,), (-907,), (5,), (99,), (1000,), (-1,), (808,), (7,), (123456789,), (10,), (-55,),
          (999999,), (2,), (1,), (4321,), (-3,), (11111,), (60,), (19,)),
    _task("chunk(items: list, size: int) -> list[list]", "Split `items` into consecutive chunks of `size` items; the last chunk may be shorter.",
          "def chunk(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]",
          ([1, 2, 3, 4, 5], 2), ([], 3), ([1, 2, 3], 3), ([1], 5), ([1, 2, 3, 4], 1), (["a", "b", "c"], 2),
          ([0, 0, 0, 0, 0, 0], 4), ([7, 8], 2), ([1, 2, 3, 4, 5, 6, 7], 3), ([9], 1), (["x"], 3), ([1, 2, 3, 4], 4),
          ([5, 4, 3, 2, 1], 10), ([1, 2], 1), ([1, 2, 3, 4, 5, 6], 2), ([True, False, True], 2),
          ([3, 1, 4, 1, 5, 9, 2, 6], 5), ([0], 1), ([[1], [2], [3]], 2), (["p", "q", "r", "s"], 3)),
    _task("max_profit(prices: list[int]) -> int", "Given daily prices, return the largest profit from buying on one day and selling on a later day, or 0 if no profit is possible.",
          "def max_profit(prices):\n    best, low = 0, None\n    for p in prices:\n        low = p if low is None else min(low, p)\n        best = max(best, p - low)\n    return best",
          ([7, 1, 5, 3, 6, 4],), ([7, 6, 4, 3, 1],), ([],), ([2, 4, 1, 10],), ([1, 2],), ([5],), ([3, 3, 3],),
          ([1, 100],), ([10, 1, 10],), ([2, 1, 2, 0, 1],), ([9, 7, 4, 1],), ([1, 2, 3, 4, 5],), ([5, 10, 1, 3],),
          ([8],), ([4, 1, 2],), ([6, 1, 3, 2, 4, 7],), ([2, 2, 5],), ([100, 180, 260, 310, 40, 535, 695],),
          ([3, 2, 6, 5, 0, 3],), ([1, 1],)),
    _task("merge_sorted(a: list[int], b: list[int]) -> list[int]", "Merge two sorted lists into one sorted list.",
          "def merge_sorted(a, b):\n    return sorted(a + b)",
          ([1, 3, 5], [2, 4, 6]), ([], [1]), ([1, 1], [1]), ([-3, 0], []), ([], []), ([5], [1]), ([1, 2, 3], [4, 5]),
          ([0], [0]), ([-5, 5], [0]), ([2], [1, 3]), ([10], []), ([1, 4, 9], [2, 3, 10]), ([7, 8], [1, 2]),
          ([3], [3, 3]), ([0, 0], [0, 1]), ([100], [-100]), ([1, 5, 9], [2, 6]), ([4], []), ([-2, -1], [-3]),
          ([6, 7], [6])),
    _task("word_counts(s: str) -> dict[str, int]", "Count the words of `s` (split on whitespace, lowercased) and return a dict from word to count.",
          "def word_counts(s):\n    out = {}\n    for w in s.lower().split():\n        out[w] = out.get(w, 0) + 1\n    return out",
          ("the cat The dog",), ("",), ("a a a",), ("Hello",), ("x y x",), ("One one ONE",), ("b a",),
          ("  spaced   out  ",), ("dog",), ("red blue red blue red",), ("A b C",), ("it is what it is",),
          ("to be or not to be",), ("z z",), ("Yes",), ("no NO",), ("q w e",), ("aa aa b",),
          ("Mixed CASE mixed",), ("1 2 1",)),
    _task("rotate(items: list, k: int) -> list", "Rotate `items` right by `k` places (k may exceed the length; an empty list stays empty).",
          "def rotate(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[-k:] + items[:-k] if k else list(items)",
          ([1, 2, 3, 4, 5], 2), ([1, 2, 3], 3), ([], 4), ([1, 2], 5), ([1, 2, 3, 4], 1), ([9], 100),
          (["a", "b", "c"], 0), ([1, 2, 3, 4, 5], 7), ([5, 6], 1), ([1, 2, 3], 4), ([0, 1, 0], 2), ([7, 8, 9], 6),
          ([1, 2, 3, 4, 5, 6], 3), (["x"], 1), ([3, 2, 1], 1), ([4, 4, 5], 2), ([1, 2, 3, 4], 8), ([10, 20, 30], 2),
          ([True, False], 3), ([1, 2, 3, 4, 5], 5)),
    _task("is_prime(n: int) -> bool", "Return True if `n` is a prime number.",
          "def is_prime(n):\n    if n < 2:\n        return False\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return False\n        i += 1\n    return True",
          (2,), (1,), (97,), (91,), (-7,), (7919,), (0,), (3,), (4,), (13,), (17,), (21,), (25,), (29,), (7917,),
          (101,), (49,), (2147483647,), (1000003,), (1000001,)),
    _task("to_binary(n: int) -> str", "Return the binary representation of the non-negative integer `n` without a prefix, e.g. 5 -> '101'.",
          "def to_binary(n):\n    return bin(n)[2:]",
          (5,), (0,), (1024,), (255,), (1,), (2,), (3,), (10,), (7,), (100,), (16,), (31,), (6,), (65535,), (9,),
          (12,), (1000,), (8,), (127,), (4,)),
    _task("transpose(matrix: list[list[int]]) -> list[list[int]]", "Return the transpose of a rectangular matrix given as a list of rows.",
          "def transpose(matrix):\n    return [list(col) for col in zip(*matrix)]",
          ([[1, 2, 3], [4, 5, 6]],), ([[1]],), ([],), ([[1, 2], [3, 4]],), ([[1], [2], [3]],), ([[5, 6, 7]],),
          ([[0, 0], [0, 0]],), ([[1, 2], [1, 2]],), ([[1, 2], [3, 4], [5, 6]],), ([[9]],), ([["a", "b"]],),
          ([[True], [False]],), ([[1, 2, 3, 4]],), ([[1], [2]],), ([[-1, -2], [-3, -4]],),
          ([[7, 8, 9], [1, 2, 3], [4, 5, 6]],), ([[2, 1], [1, 2]],), ([[0, 1, 2], [3, 4, 5]],), ([[5]],),
          ([[1, 2], [3, 4], [5, 6], [7, 8]],)),
)

TASKS_BY_NAME: dict[str, CodeTask] = {task.name: task for task in TASKS}


def _function(name: str, source: str) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<reference {name}>", "exec"), namespace)  # trusted, bundled source
    return namespace[name]


def _outputs(function: Callable[..., Any], test: tuple[Call, ...]) -> str:
    """One test's outputs as canonical JSON, each call given fresh JSON-decoded arguments."""
    return canonical([function(*json.loads(json.dumps(call))) for call in test])


@functools.lru_cache(maxsize=None)
def expected_outputs(name: str) -> tuple[str, ...]:
    """The reference solution's outputs for each hidden test (a JSON list, one entry per call)."""
    task = TASKS_BY_NAME[name]
    reference = _function(name, task.reference)
    return tuple(_outputs(reference, test) for test in task.tests)


def canonical(value: Any) -> str:
    """A JSON value as comparable text (dict keys sorted)."""
    return json.dumps(value, sort_keys=True)


#: Answers that ignore the task: the usual constants, and the input given back.
TRIVIAL_ANSWERS: dict[str, Callable[..., Any]] = {
    **{
        f"return {value!r}": (lambda value: lambda *args: json.loads(json.dumps(value)))(value)
        for value in (True, False, None, 0, 1, -1, 2, "", " ", "0", "1", [], {}, [[]])
    },
    "return the first argument": lambda *args: args[0],
    "return the last argument": lambda *args: args[-1],
    "return the arguments as a list": lambda *args: list(args),
}


@functools.lru_cache(maxsize=None)
def trivial_scores(name: str) -> dict[str, float]:
    """Each trivial answer's score (fraction of hidden tests passed) on task ``name``."""
    expected = expected_outputs(name)
    tests = TASKS_BY_NAME[name].tests
    return {
        label: sum(_outputs(answer, test) == want for test, want in zip(tests, expected)) / len(tests)
        for label, answer in TRIVIAL_ANSWERS.items()
    }


def best_trivial_answer(name: str) -> tuple[str, float]:
    """The trivial answer that scores highest on task ``name``, and its score."""
    return max(trivial_scores(name).items(), key=lambda item: item[1])
