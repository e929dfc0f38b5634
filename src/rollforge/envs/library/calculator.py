"""``calculator``: three-digit arithmetic through tools, in two turns, where choosing the right tool is learned.

An environment class in the ``environment_factory`` style. The prompt asks "What is 347 times 29?"
(``plus``, ``minus`` or ``times``, operands of ``digits`` digits, three by default: past what a
small model computes in its head). The operation tools are ``add``, ``subtract`` and ``multiply``,
each returning ``a <op> b``; one computation per question (a second call gets an error and changes
nothing). Then the model gives its result with ``answer(value)``, which ends the episode: reward
1.0 when the answered value is the question's result, else 0.0 (also when the model answers in
text, or guesses without computing). Once answered, every tool returns ``EPISODE_OVER`` and changes
nothing, so a framework that ignores ``done`` (TRL runs every call of a message and one more turn)
scores what rollforge scores. The tools carry no return annotation (rollforge's schemas have none;
transformers' ``get_json_schema`` would render one), so TRL and rollforge render the same tools. The row columns are ``a``, ``b``, ``op``, ``result`` and
``environment``.

``samples(..., operations=("plus", "times"))`` asks only those operations and offers only their
tools (the row's ``environment`` column picks the class with those methods; the system prompt names
them): with two, which tool to call is a binary choice.

Two variants, both off by default (the quickstart plays neither):

- ``computations=k`` asks a chain of ``k`` operations read left to right ("What is 34 times 29,
  then plus 18?"): ``k`` tool calls, each on the previous result, then ``answer``, so ``k + 1``
  tool turns whose choices pay only together, at the end (row column ``then``: the operations after
  the first, as ``[word, operand]`` pairs).
- ``continuation=True``: the question starts from a number, as a chain's later operations do
  ("What is 986, then plus 18?": ``add(986, 18)``, then ``answer``), the number being what a
  first operation on two ``digits``-digit operands gives. Its one tool choice reads the word after
  "then" where a chain's second call does (row column ``continuation``; ``a`` is the number, ``op``
  and ``b`` the first operation after it).
- ``closing=True``: ``answer`` does not end the episode; the model closes it with a reply without a
  tool call (the expert says ``CLOSING``), as TRL's tool loop does, which generates one more turn
  after the last tool result (row column ``closing``). The reward is the same.

The call format, copying the operands and then copying the tool's result into ``answer`` are easy
to demonstrate; which tool a question needs is the strategy, and that is what reinforcement
learning is left to find.

``expert`` is a format teacher, not a strategy teacher: it calls one of the offered operation tools
(those the system prompt names), chosen uniformly at random (seeded by the question, so
demonstrations are reproducible), with the question's operands, then answers the value the tool
returned. A warm-up on all its demonstrations (``min_reward: null``) learns the two-turn format but
not which tool a question needs.
"""

from __future__ import annotations

import random
import re
from itertools import product
from typing import Sequence

from ...chat.toolcalls import ToolCallParser
from ...errors import ConfigError
from ...types import Message, Sample
from ..base import Environment
from ..experts import format_tool_call

#: The question's word for each operation, and the tool that computes it.
OPERATIONS = {"plus": "add", "minus": "subtract", "times": "multiply"}
_APPLY = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b}
_QUESTION = re.compile(r"What is (\d+)(?: (plus|minus|times) (\d+))?((?:, then (?:plus|minus|times) \d+)*)\?")
_WORD = re.compile(r"\b(plus|minus|times)\b")
_THEN = re.compile(r", then (plus|minus|times) (\d+)")
_OFFERED = re.compile(r"\b(add|subtract|multiply)\b")
#: What a second computation returns (the first one stands).
ONE_COMPUTATION = "Error: one computation per question; give your result with answer."
#: What every tool returns once the episode is over (``answer`` was called).
EPISODE_OVER = "Error: the episode is over."
#: What ``answer`` returns.
RECORDED = "Recorded."
#: The expert's closing reply after ``answer`` (``closing=True``).
CLOSING = "Done."


def system_prompt(tools: Sequence[str], computations: int = 1, closing: bool = False) -> str:
    """The instruction, naming the offered tools (the expert reads its choices from it)."""
    names = list(tools)
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    compute = (
        f"Compute with one tool call ({listed})"
        if computations == 1
        else f"Compute left to right with one tool call ({listed}) per operation, each on the last result"
    )
    return f"{compute}, then call answer with the result" + (f", then reply {CLOSING}" if closing else ".")


SYSTEM_PROMPT = system_prompt(list(_APPLY))


class _Calculator:
    """The episode logic and ``answer``; a subclass adds the operation tools it offers."""

    def __init__(self) -> None:
        self._result = 0
        self._computations = 1  # the question's operations: the computations allowed
        self._computed = 0
        self._closing = False
        self._answered: int | None = None
        self.done = False

    def reset(self, result: int, then: Sequence[object] = (), closing: bool = False, **_: object) -> None:
        self._result = int(result)
        self._computations, self._closing = 1 + len(then), bool(closing)
        self._computed, self._answered = 0, None
        self.done = False
        return None

    def _compute(self, value: int) -> str:
        if self._answered is not None:
            return EPISODE_OVER
        if self._computed >= self._computations:
            return (
                ONE_COMPUTATION
                if self._computations == 1
                else f"Error: {self._computations} computations per question; give your result with answer."
            )
        self._computed += 1
        return str(value)

    def answer(self, value: int):
        """Give the final result; this ends the episode.

        Args:
            value: The result of the computation.
        """
        if self._answered is not None:
            return EPISODE_OVER
        self._answered = value
        self.done = not self._closing  # closing: the model's reply without a tool call ends it
        return RECORDED

    def get_reward(self) -> float:
        return 1.0 if self._answered == self._result else 0.0


def _operand_tool(name: str, symbol: str):
    def tool(self, a: int, b: int):  # no annotation on self or return: transformers' get_json_schema would render them
        return self._compute(_APPLY[name](a, b))

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = f"""Return a {symbol} b.

        Args:
            a: The first number.
            b: The second number.
        """
    return tool


_TOOLS = {name: _operand_tool(name, symbol) for name, symbol in (("add", "+"), ("subtract", "-"), ("multiply", "*"))}

#: Every operation tool, and ``answer``.
CalculatorEnv = type("CalculatorEnv", (_Calculator,), {"__module__": __name__, **_TOOLS})


def _tool_set(tools: Sequence[str]) -> str:
    """The key of the environment class offering ``tools`` (the row's ``environment`` column)."""
    return "+".join(tools)


def _classes() -> dict[str, type]:
    """A class for every non-empty set of tools, in the order ``add``, ``subtract``, ``multiply``
    (built once, below, as attributes of this module: pickle finds them by name, so an environment
    crosses to engine worker processes)."""
    names = list(_APPLY)
    out = {}
    for mask in range(1, 2 ** len(names)):
        tools = [n for i, n in enumerate(names) if mask >> i & 1]
        cls = (
            CalculatorEnv
            if len(tools) == len(names)
            else type(
                f"CalculatorEnv_{'_'.join(tools)}",
                (_Calculator,),
                {"__module__": __name__, **{t: _TOOLS[t] for t in tools}},
            )
        )
        out[_tool_set(tools)] = cls
    return out


#: The classes by tool set (the row's ``environment`` column), each also a module attribute.
CLASSES = _classes()
globals().update({cls.__name__: cls for cls in CLASSES.values()})


def expert(messages: Sequence[Message], parser: ToolCallParser) -> str:
    """A random offered tool per operation, each on the question's operands (from the second on, the
    last result and the next operand), then ``answer`` with the last value a tool returned; after
    ``answer`` (``closing``), ``CLOSING``.

    The offered tools are the ones the system prompt names (all three when it names none).
    """
    results = [m.content for m in messages if m.role == "tool"]
    if results and results[-1] == RECORDED:
        return CLOSING
    question = next((m.content for m in reversed(messages) if m.role == "user"), "")
    found = _QUESTION.search(question)
    if found is None or not (found.group(3) or found.group(4)):  # none, or a number alone ("What is 986?")
        return "I cannot read the question."
    first = [int(found.group(3))] if found.group(3) else []  # none: a continuation
    operands = [int(found.group(1)), *first, *(int(x) for _, x in _THEN.findall(found.group(4)))]
    last = re.fullmatch(r"-?\d+", results[-1].strip()) if results else None
    if results and last is None:
        return "I cannot read the result."
    if len(results) >= len(operands) - 1:
        return format_tool_call(parser, "answer", {"value": int(last.group())})
    system = next((m.content for m in messages if m.role == "system"), "")
    tools = expert_tools(question[found.start() : found.end()], _OFFERED.findall(system) or list(_APPLY))
    a = int(last.group()) if last else operands[0]
    return format_tool_call(parser, tools[len(results)], {"a": a, "b": operands[len(results) + 1]})


def expert_tools(question: str, offered: Sequence[str]) -> tuple[str, ...]:
    """The offered tools the expert calls on ``question``, one per operation: uniform, seeded by
    the question's text."""
    rng, choices = random.Random(question), sorted(set(offered))
    return tuple(rng.choice(choices) for _ in _WORD.findall(question))


def build() -> Environment:
    from ..factory import FactoryEnvironment

    return FactoryEnvironment(dict(CLASSES))


def _check_operations(operations: object) -> tuple[str, ...]:
    words = tuple(operations) if isinstance(operations, (list, tuple)) else None
    if not words or len(set(words)) != len(words) or not set(words) <= set(OPERATIONS):
        raise ConfigError(f"calculator operations must be distinct words among plus, minus, times, got {operations!r}")
    return words


def samples(
    n: int,
    seed: int,
    *,
    digits: int = 3,
    operations: Sequence[str] = ("plus", "minus", "times"),
    balanced: bool = False,
    computations: int = 1,
    closing: bool = False,
    continuation: bool = False,
) -> list[Sample]:
    """``n`` questions of ``computations`` operations each, uniform over ``operations``, operands of
    ``digits`` digits; ``closing``: the episode ends with a reply after ``answer``; ``continuation``:
    the question starts from a number (module docstring).

    Only the tools of ``operations`` are offered (``("plus", "times")``: add or multiply, a binary choice).
    ``balanced``: every sequence of operations is asked equally often and, on each, the expert
    calls every sequence of offered tools equally often, in every consecutive block of all
    (operations, tools) pairs of sequences. For warm-up demonstrations, a warm-up then learns no
    preference between the tools; for GRPO prompts read in order (``data.shuffle: false``), every
    batch of a multiple of the block asks each kind equally (one operation of two, two tools:
    blocks of 4, so batches of 4, 8, ...).
    """
    for name, value in (("digits", digits), ("computations", computations)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"calculator {name} must be a positive int, got {value!r}")
    words = sorted(_check_operations(operations))
    tools = [t for t in _APPLY if t in {OPERATIONS[w] for w in words}]
    system = Message("system", system_prompt(tools, computations, bool(closing)))
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    rng = random.Random(seed)
    kinds = _balanced_kinds(n, words, tools, computations, rng) if balanced else None
    out = []
    for i in range(n):  # unbalanced: drawn one question at a time, so samples(k) starts samples(n)
        chosen, wanted = kinds[i] if kinds else (tuple(rng.choice(words) for _ in range(computations)), None)
        while True:
            operands = [rng.randint(low, high) for _ in range(computations + 1)]
            if continuation:  # the number a first operation gives
                operands[0] = _APPLY[OPERATIONS[rng.choice(words)]](operands[0], rng.randint(low, high))
            question = _question(chosen, operands, continuation)
            if wanted is None or expert_tools(question, tools) == wanted:  # else other operands
                break
        result = operands[0]
        for word, operand in zip(chosen, operands[1:]):
            result = _APPLY[OPERATIONS[word]](result, operand)
        row = {"a": operands[0], "b": operands[1], "op": chosen[0], "result": result, "environment": _tool_set(tools)}
        if computations > 1:
            row["then"] = [[w, x] for w, x in zip(chosen[1:], operands[2:])]
        if closing:
            row["closing"] = True
        if continuation:
            row["continuation"] = True
        out.append(Sample(prompt=(system, Message("user", question)), task_name="calculator", row=row))
    return out


def _question(chosen: Sequence[str], operands: Sequence[int], continuation: bool) -> str:
    """ "What is 34 times 29, then plus 18?"; a continuation: "What is 986, then plus 18?"."""
    first = "" if continuation else f" {chosen[0]} {operands[1]}"
    rest = zip(chosen, operands[1:]) if continuation else zip(chosen[1:], operands[2:])
    return f"What is {operands[0]}{first}" + "".join(f", then {w} {x}" for w, x in rest) + "?"


def _balanced_kinds(
    n: int, words: Sequence[str], tools: Sequence[str], computations: int, rng: random.Random
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """``n`` (operations, tools the expert calls) pairs of sequences, in seeded blocks that hold
    every pair once (unshuffled batches of a multiple of the block are balanced too).

    One operation: each block is all (word, tool) pairs in a shuffled order (4 with two
    operations; the quickstart's runs read these questions, so this order stays). A chain: each
    block is a shuffled Latin square of the operation sequences against the tool sequences (as many
    of each, since every operation has its tool), so that each run of ``len(words) ** computations``
    questions in it also asks every operation sequence once and has the expert call every tool
    sequence once: two operations of two give runs of 4 in blocks of 16, and GRPO batches of 4
    that ask every kind of question once.
    """
    sequences = list(product(words, repeat=computations)), list(product(tools, repeat=computations))
    kinds: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    while len(kinds) < n:
        kinds += _block(*sequences, rng) if computations == 1 else _latin_block(*sequences, rng)
    return kinds[:n]


def _block(asked: list[tuple[str, ...]], called: list[tuple[str, ...]], rng: random.Random) -> list:
    block = [(w, t) for w in asked for t in called]
    rng.shuffle(block)
    return block


def _latin_block(asked: list[tuple[str, ...]], called: list[tuple[str, ...]], rng: random.Random) -> list:
    asked, called, shifts = list(asked), list(called), list(range(len(called)))
    for order in (asked, called, shifts):
        rng.shuffle(order)
    block = []
    for shift in shifts:
        run = [(w, called[(i + shift) % len(called)]) for i, w in enumerate(asked)]
        rng.shuffle(run)
        block += run
    return block
