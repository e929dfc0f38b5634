"""Fuzzing the tool-call path: malformed calls in every family's format, through the real engine.

A seeded generator writes tool calls the way each family's parser reads them (``hermes``,
``llama3_json``, ``mistral`` in both forms, ``qwen3_coder``, ``deepseek`` in both forms,
``harmony``) and breaks most of them on purpose, each in a way whose outcome is known in advance:

- ``truncated``: the reply is cut inside the arguments (or, for Qwen3-Coder's XML, inside a tag);
- ``hostile value``: ``NaN``, ``Infinity``, ``-Infinity``, ``1e999``, a 5,000-digit integer,
  nesting past the decoder's limits, a lone surrogate escape;
- ``noise``: a structural character replaced; ``bad shape``: arguments that are not an object,
  a duplicated parameter; ``bad name``: a name that is not a string or not one word;
- ``unknown tool``, ``bad arguments`` (enum violated, wrong type, missing, extra);
- and valid calls, some cut inside their closing marker, which must run.

The replies go through ``arollout`` exactly as a model's would: the scripted backend turns them
into token ids, the engine decodes and parses them with the family's parser, a
``FactoryEnvironment`` validates and runs the tools, and the chat template renders the results.
Every episode is then checked: no episode failed; each reply came back as the same text; each
call produced one tool message, an error exactly when the call was malformed, counted as a
failure of the expected kind; and the token ids match the template's rendering
(``token_fidelity_gap``). Anything else is an invariant violation.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from ..backends.scripted import ScriptedBackend
from ..chat.render import ChatRenderer, token_fidelity_gap
from ..envs.factory import FactoryEnvironment
from ..errors import ConfigError
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..testing import tokenizer_or_tiny
from ..types import Sample

FAMILIES = ("hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek", "harmony")
INVALID, UNKNOWN, BAD_ARGUMENTS = "tool_invalid_json", "tool_unknown", "tool_bad_arguments"


class Walker:
    """Walks along a line (the fuzzed tools)."""

    def reset(self, **row: Any) -> str:
        self.position = 0
        return "Walk."

    async def move(self, direction: Literal["left", "right"], steps: int) -> str:
        """Move along the line.

        Args:
            direction: Which way.
            steps: How far.
        """
        self.position += steps if direction == "right" else -steps
        return f"at {self.position}"

    async def look(self) -> str:
        """Say where the walker is."""
        return f"at {self.position}"


@dataclass(frozen=True)
class Case:
    """One fuzzed reply and what the environment must make of it (None: the call runs)."""

    text: str
    expected: str | None
    mutation: str


# A value as (JSON text, Qwen3-Coder parameter text).
_HOSTILE = (
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"),
    ("1e999", "1e999"),
    ("-2.5e400", "-2.5e400"),
    ("7" * 5000, "7" * 5000),
    ('"\\ud800"', '"\\ud800"'),
    ('"\\udc00x"', '"\\udc00x"'),
)


def _value(value: Any) -> tuple[str, str]:
    return json.dumps(value), value if isinstance(value, str) else json.dumps(value)


def _nested(rng: random.Random) -> tuple[str, str]:
    depth = rng.choice((65, 100, 300, 1500))  # past rollforge's limit, and past the C decoder's
    text = "[" * depth + "]" * depth
    return text, text


class _Writer:
    """Writes one call in a family's format; ``arguments`` are (key, JSON text, Qwen text) triples."""

    def __init__(self, family: str, rng: random.Random):
        self.family, self.rng = family, rng
        # Mistral, DeepSeek: pick the form once per call.
        self.form = rng.choice((0, 1))

    def positional_name(self) -> bool:
        """Whether the format writes the name as bare text rather than a JSON string."""
        return self.family in ("qwen3_coder", "deepseek", "harmony") or (self.family == "mistral" and self.form)

    def __call__(
        self, name: str, arguments: list[tuple[str, str, str]], name_json: str | None = None
    ) -> tuple[str, str]:
        """The reply and its closing marker (the text a cut may fall into)."""
        name_json = name_json or json.dumps(name)
        args = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v, _ in arguments) + "}"
        family = self.family
        if family == "hermes":
            return f'<tool_call>\n{{"name": {name_json}, "arguments": {args}}}\n', "</tool_call>"
        if family == "llama3_json":
            return ("<|python_tag|>" if self.form else "") + f'{{"name": {name_json}, "parameters": {args}}}', ""
        if family == "mistral":
            call_id = "".join(self.rng.choice("abcdefghijkABCDEFGH0123456789") for _ in range(9))
            if self.form:
                return f"[TOOL_CALLS]{name}[ARGS]{args}", "</s>"
            return f'[TOOL_CALLS] [{{"name": {name_json}, "arguments": {args}, "id": "{call_id}"}}]', "</s>"
        if family == "deepseek":
            head = f"function<｜tool▁sep｜>{name}\n```json\n{args}\n```" if self.form else f"{name}<｜tool▁sep｜>{args}"
            return f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{head}", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        if family == "harmony":
            thinking = "<|channel|>analysis<|message|>Walk.<|end|><|start|>assistant" if self.form else ""
            return f"{thinking}<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}", "<|call|>"
        parameters = "".join(f"<parameter={k}>\n{q}\n</parameter>\n" for k, _, q in arguments)
        return f"<tool_call>\n<function={name}>\n{parameters}", "</function>\n</tool_call>"


_MUTATIONS = (
    "valid",
    "valid cut",
    "truncated",
    "hostile value",
    "noise",
    "bad shape",
    "bad name",
    "unknown tool",
    "bad arguments",
)
_WEIGHTS = (1, 1, 2, 2, 2, 2, 2, 2, 2)  # 7 in 8 calls malformed


def make_case(family: str, rng: random.Random) -> Case:
    """One fuzzed reply for ``family`` (see the module docstring for the mutations)."""
    write = _Writer(family, rng)
    qwen = family == "qwen3_coder"
    good = [("direction", *_value(rng.choice(("left", "right")))), ("steps", *_value(rng.randint(0, 9)))]
    mutation = rng.choices(_MUTATIONS, _WEIGHTS)[0]
    if mutation in ("valid", "valid cut"):
        text, close = write("move", good) if rng.random() < 0.8 else write("look", [])
        cut = rng.randint(0, len(close) - 1) if mutation == "valid cut" and close else len(close)
        return Case(text + close[:cut], None, mutation)
    if mutation == "truncated":
        text, _ = write("move", good)
        if qwen:  # inside a tag name: an unterminated tag
            tag = rng.choice(("<function=", "<parameter="))
            at = text.index(tag) + len(tag)
            return Case(text[: rng.randint(at, text.index(">", at) - 1)], INVALID, mutation)
        args = "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v, _ in good) + "}"
        start = text.rindex(args)
        return Case(text[: rng.randint(start + 1, start + len(args) - 1)], INVALID, mutation)
    if mutation == "hostile value":
        value = _nested(rng) if rng.random() < 0.25 else rng.choice(_HOSTILE)
        text, close = write("move", [good[0], ("steps", *value)])
        # Qwen3-Coder values are text: unreadable ones stay strings and fail validation instead
        return Case(text + close, BAD_ARGUMENTS if qwen else INVALID, mutation)
    if mutation == "noise":
        text, close = write("move", good)
        if qwen:
            at = text.index("<function=move") + len("<function=move")
        else:
            at = text.index(":", text.rindex('"direction"'))
        return Case(text[:at] + rng.choice((" ", ";", "=", "|")) + text[at + 1 :] + close, INVALID, mutation)
    if mutation == "bad shape":
        if qwen:
            text, close = write("move", [good[0], good[0], good[1]])  # a parameter given twice
            return Case(text + close, INVALID, mutation)
        write_args = rng.choice(("[1, 2]", "3", '"{oops"', '"[]"'))
        text, close = write("move", [])
        return Case(text.replace("{}", write_args, 1) + close, INVALID, mutation)
    if mutation == "bad name":
        if write.positional_name():
            name = rng.choice(("two words", "a{b}", ""))
            text, close = write(name, good)
            if family == "harmony" and name == "two words":  # the recipient ends at a space: tool "two"
                return Case(text + close, UNKNOWN, mutation)
        else:
            text, close = write("move", good, name_json=rng.choice(("5", '""', "null", "[]", '"two words"')))
            if '"two words"' in text:  # a JSON string name may hold spaces: the tool is unknown
                return Case(text + close, UNKNOWN, mutation)
        return Case(text + close, INVALID, mutation)
    if mutation == "unknown tool":
        text, close = write(rng.choice(("fly", "move_", "Look")), good)
        return Case(text + close, UNKNOWN, mutation)
    return _bad_arguments(write, good, rng)


def _bad_arguments(write: _Writer, good: list, rng: random.Random) -> Case:
    """A well-formed call of a known tool whose arguments break its schema."""
    problem = rng.choice(("enum", "type", "missing", "extra"))
    arguments = {
        "enum": [("direction", *_value("up")), good[1]],
        "type": [good[0], ("steps", *_value("two"))],
        "missing": [good[1]],
        "extra": [*good, ("speed", *_value(3))],
    }[problem]
    text, close = write("move", arguments)
    return Case(text + close, BAD_ARGUMENTS, "bad arguments")


@dataclass
class _Tally:
    """What the checks found, over all families."""

    failures: Counter[str] = field(default_factory=Counter)
    expected_failures: Counter[str] = field(default_factory=Counter)
    mutations: Counter[str] = field(default_factory=Counter)
    failed_episodes: int = 0
    violations: list[str] = field(default_factory=list)


def run(calls: int = 100_000, seed: int = 0, turns: int = 8, tokenizer_dir: str | None = None) -> dict[str, Any]:
    """Fuzz ``calls`` tool calls, split evenly over ``FAMILIES``, ``turns`` per episode."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < len(FAMILIES):
        raise ConfigError(f"--calls must be an integer of at least {len(FAMILIES)} (one per family), got {calls!r}")
    renderer = ChatRenderer(tokenizer_or_tiny(tokenizer_dir))
    rng = random.Random(seed)
    shares: dict[str, int] = {}
    tally = _Tally()
    wall = 0.0
    for number, family in enumerate(FAMILIES):
        shares[family] = calls // len(FAMILIES) + (1 if number < calls % len(FAMILIES) else 0)
        cases = [make_case(family, rng) for _ in range(shares[family])]
        wall += _fuzz_family(family, cases, renderer, turns, tally)
    return {
        "benchmark": "fuzz",
        "seed": seed,
        "calls": calls,
        "calls_per_family": shares,
        "mutations": dict(sorted(tally.mutations.items())),
        "failures_by_kind": dict(sorted(tally.failures.items())),
        "expected_failures_by_kind": dict(sorted(tally.expected_failures.items())),
        "failed_episodes": tally.failed_episodes,
        "invariant_violations": len(tally.violations),
        "violation_examples": tally.violations[:5],
        "wall_seconds": round(wall, 3),
        "ms_per_call": round(1000 * wall / calls, 4),
    }


def _fuzz_family(family: str, cases: list[Case], renderer: ChatRenderer, turns: int, tally: _Tally) -> float:
    """Roll the cases out as episodes of ``turns`` replies each; check them; return the wall time."""
    replies = iter([case.text for case in cases])
    expected = {case.text: case for case in cases}
    # When the cases run out, the last episodes end with a plain answer.
    backend = ScriptedBackend(lambda request: next(replies, _ANSWER), renderer, end_token_id=renderer.stop_token_ids[0])
    samples = [
        Sample(prompt=[{"role": "user", "content": f"Walk {i}."}], task_name="walk")
        for i in range(-(-len(cases) // turns))
    ]
    config = RolloutConfig(
        max_turns=turns,
        concurrency=256,
        max_seq_len=1 << 20,
        max_new_tokens=1 << 16,
        tool_parser=family,
        step_timeout=None,
    )
    started = time.perf_counter()
    result = asyncio.run(arollout(samples, {"walk": FactoryEnvironment(Walker)}, backend, renderer, config))
    wall = time.perf_counter() - started
    for trajectory in result.trajectories:
        _check(trajectory, family, expected, renderer, tally)
    return wall


_ANSWER = "Done."


def _check(trajectory: Any, family: str, expected: dict[str, Case], renderer: ChatRenderer, tally: _Tally) -> None:
    violations = tally.violations
    where = f"{family} episode {trajectory.index}"
    if trajectory.error is not None:
        tally.failed_episodes += 1
        violations.append(f"{where}: episode failed: {trajectory.error.kind}: {trajectory.error.message[:200]}")
        return
    tally.failures.update(f.kind for f in trajectory.failures)
    failures = iter(trajectory.failures)
    messages = trajectory.messages
    for i, message in enumerate(messages):
        if message.role != "assistant":
            continue
        case = expected.get(message.content)
        if message.content == _ANSWER:
            continue
        if case is None:
            violations.append(f"{where}: a reply came back changed: {message.content[:120]!r}")
            continue
        tally.mutations[case.mutation] += 1
        results = [m.role for m in messages[i + 1 : i + 3]]
        if results[:1] != ["tool"] or results[1:] == ["tool"]:
            violations.append(
                f"{where}: {case.mutation} call {case.text[:80]!r} got {results.count('tool')} tool messages"
            )
            continue
        result, outcome = messages[i + 1], None
        if result.content.startswith("Error: "):
            failure = next(failures, None)
            outcome = failure.kind if failure is not None else "uncounted error"
        if case.expected is not None:
            tally.expected_failures[case.expected] += 1
        if outcome != case.expected:
            violations.append(
                f"{where}: {case.mutation} call {case.text[:80]!r}: expected {case.expected}, got {outcome} "
                f"({result.content[:120]!r})"
            )
    if next(failures, None) is not None:
        violations.append(f"{where}: more failures counted than error messages sent")
    gap = token_fidelity_gap(trajectory, renderer)
    if gap is not None:
        violations.append(f"{where}: token ids differ from the template's rendering: {gap[:200]}")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--calls", type=int, default=100_000, help="fuzzed tool calls in all (split over the families)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns", type=int, default=8, help="replies per episode")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the tiny test model's)")


def main(args: Any) -> dict[str, Any]:
    return run(args.calls, args.seed, args.turns, args.tokenizer)
