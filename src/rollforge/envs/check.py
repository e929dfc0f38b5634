"""``check_env``: drive an environment through the ``EnvSession`` contract and report the first
broken rule, in the spirit of Gymnasium's ``env_checker``. Every bundled environment passes it in CI.

For each sample the checker plays scripted episodes with synthetic assistant messages: for tool
environments (``Reset.tools`` not empty) one tool call per turn with random arguments that are valid
for the tool's JSON schema (enum values included); for step-style environments short plain-text
answers ("7", "The answer is 12.", ...). The script comes from a seeded RNG, so it is the same every
time (``envs/check_actions.py`` writes it). Rules, checked in this order (2 to 4 in
``envs/check_values.py``):

1. the environment has ``open(sample)`` and ``max_sessions`` (None or a positive int); ``open``
   returns an ``EnvSession`` whose methods return awaitables;
2. ``reset`` returns a ``Reset`` whose prompt is a non-empty tuple of ``Message``, whose tools are
   well-formed OpenAI function schemas (``type: function``, a name, ``parameters`` an object schema
   with ``properties`` and ``required`` naming only listed properties; names unique) and whose
   ``stop`` is None or a tuple of str;
3. ``step`` returns a ``Step``: a tuple of ``Message``, a finite float reward, bools ``terminated``
   and ``truncated``, ``stop`` None or a tuple of str, ``failures`` a tuple of ``Failure``; once
   ``terminated`` or ``truncated`` the episode is over and the checker steps no more;
4. ``finish`` returns a finite float; ``close`` may be called twice without raising;
5. determinism: three sessions of the same sample given the same actions (one alone, then two at
   once, which also exercises batching and catches state shared between sessions) observe the
   same messages, rewards, endings (``terminated``/``truncated``), stop strings, metadata and
   final rewards;
6. invalid tool calls (unknown tool, arguments that break the schema, unparseable JSON) come back as
   a ``Step`` with a counted failure and a message telling the model, never as an exception;
7. environments graded by hidden tests (an ``EnvSpec`` with ``best_trivial_answer``): no answer
   that ignores the task (a constant, the input given back) scores above ``TRIVIAL_ANSWER_LIMIT``
   on any checked sample; the best such score is reported in the ``CheckReport``;
8. images, checked with rules 2 and 3 (``check_values.check_images``): a message carries images
   only when the environment declares ``produces_images``, each a PIL image or encoded bytes; rule
   5 compares them too.

Any exception an environment raises, or a call that exceeds ``timeout`` seconds, is reported as the
rule that was being checked. ``acheck_env`` is the implementation; ``check_env`` runs it with
``workers.run_sync`` (also inside a running event loop). Both return a ``CheckReport`` when every rule holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from ..errors import ConfigError, EnvironmentError_
from ..types import Message, Sample, ToolCall
from ..workers import run_sync
from .base import Environment, EnvSession, Step, is_session_limit
from .check_actions import invalid_arguments, scripted_action, tool_call_message
from .check_values import as_json, check_images, check_reset, check_reward, check_step, image_digests, short
from .library import EnvSpec, get_env_spec

__all__ = ["CheckReport", "TRIVIAL_ANSWER_LIMIT", "check_env", "acheck_env"]

T = TypeVar("T")

_UNKNOWN_TOOL = "__check_env_no_such_tool__"

#: The most an answer that ignores the task may score on an environment graded by hidden tests.
TRIVIAL_ANSWER_LIMIT = 0.1


@dataclass(frozen=True)
class CheckReport:
    """What ``check_env`` measured on an environment that passed every rule."""

    #: The environment's name.
    name: str
    #: How many samples were played.
    samples: int
    #: Environments graded by hidden tests: the answer ignoring the task that scored highest on
    #: a checked sample, and its score; None for the others.
    best_trivial_answer: tuple[str, float] | None = None

    def __str__(self) -> str:
        line = f"check_env({self.name}): every rule holds on {self.samples} samples"
        if self.best_trivial_answer is not None:
            label, score = self.best_trivial_answer
            line += f"; best answer that ignores the task ({label}) scores {score:.2f}"
        return line


async def acheck_env(
    env_or_spec: Environment | EnvSpec | str,
    *,
    samples: Sequence[Sample] | None = None,
    steps: int = 10,
    seed: int = 0,
    timeout: float = 30.0,
) -> CheckReport:
    """Check ``env_or_spec`` against the environment contract; raise ``EnvironmentError_``
    describing the first violated rule (see the module docstring), return a ``CheckReport`` when
    all hold.

    Args:
        env_or_spec: An ``Environment``, or an ``EnvSpec`` from the library or its name (it is
            built and its ``samples(3, seed)`` are used unless ``samples`` is given).
        samples: The samples to play; required for a bare ``Environment``.
        steps: The most steps an episode is played for.
        seed: Seeds the scripted actions (and the spec's samples).
        timeout: Seconds any single environment call may take.
    """
    if isinstance(env_or_spec, str):
        env_or_spec = get_env_spec(env_or_spec)
    trivial: Callable[[Sample], tuple[str, float]] | None = None
    if isinstance(env_or_spec, EnvSpec):
        trivial = env_or_spec.best_trivial_answer
        name = env_or_spec.name
        env = env_or_spec.build()
        samples = list(samples) if samples is not None else env_or_spec.samples(3, seed)
    else:
        env = env_or_spec
        name = type(env).__name__
        if samples is None:
            raise ConfigError("check_env needs samples=[...] to check a bare Environment")
        samples = list(samples)
    if not samples:
        raise ConfigError("check_env needs at least one sample")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps must be a positive int, got {steps!r}")
    checker = _Checker(env, name, steps=steps, seed=seed, timeout=timeout)
    checker.check_environment()
    for index, sample in enumerate(samples):
        await checker.check_sample(index, sample)
    best = checker.check_trivial_answers(samples, trivial) if trivial is not None else None
    return CheckReport(name, len(samples), best)


def check_env(
    env_or_spec: Environment | EnvSpec | str,
    *,
    samples: Sequence[Sample] | None = None,
    steps: int = 10,
    seed: int = 0,
    timeout: float = 30.0,
) -> CheckReport:
    """Synchronous ``acheck_env`` (runs its own event loop, also in a notebook)."""
    return run_sync(acheck_env(env_or_spec, samples=samples, steps=steps, seed=seed, timeout=timeout))


class _Checker:
    def __init__(self, env: Any, name: str, *, steps: int, seed: int, timeout: float):
        self.env = env
        self.name = name
        self.steps = steps
        self.seed = seed
        self.timeout = timeout

    def fail(self, rule: str) -> EnvironmentError_:
        return EnvironmentError_(f"check_env({self.name}): {rule}")

    # -- rule 1 ----------------------------------------------------------------------------------

    def check_environment(self) -> None:
        if not callable(getattr(self.env, "open", None)):
            raise self.fail(f"{type(self.env).__name__} has no open(sample) method; it is not an Environment")
        if not hasattr(self.env, "max_sessions"):
            raise self.fail("the environment has no max_sessions attribute (None means no limit)")
        limit = self.env.max_sessions
        if not is_session_limit(limit):
            raise self.fail(f"max_sessions must be None or a positive int, got {limit!r}")

    def open(self, sample: Sample) -> EnvSession:
        try:
            session = self.env.open(sample)
        except Exception as exc:
            raise self.fail(f"open(sample) raised {_describe(exc)}") from exc
        if not isinstance(session, EnvSession):
            raise self.fail(
                f"open(sample) returned {type(session).__name__}, which lacks part of EnvSession "
                f"(reset, step, finish, close, metadata, handle)"
            )
        return session

    async def call(self, what: str, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await method(*args)`` within the timeout; anything that goes wrong names ``what``."""
        try:
            awaitable = method(*args)
        except Exception as exc:
            raise self.fail(f"{what} raised {_describe(exc)}") from exc
        if not inspect.isawaitable(awaitable):
            raise self.fail(
                f"{what} returned {type(awaitable).__name__} {short(awaitable)} instead of an awaitable; "
                f"EnvSession methods are async"
            )
        try:
            return await asyncio.wait_for(awaitable, self.timeout)
        except asyncio.TimeoutError as exc:
            raise self.fail(f"{what} did not return within {self.timeout:g}s") from exc
        except Exception as exc:
            raise self.fail(f"{what} raised {_describe(exc)}") from exc

    # -- one sample, rule 5 ----------------------------------------------------------------------

    async def check_sample(self, index: int, sample: Sample) -> None:
        first = await self.episode(index, sample)
        if self.env.max_sessions is None or self.env.max_sessions >= 2:
            second, third = await asyncio.gather(self.episode(index, sample), self.episode(index, sample))
        else:
            second = await self.episode(index, sample)
            third = await self.episode(index, sample)
        for other in (second, third):
            if other != first:
                position = next(
                    (i for i, (a, b) in enumerate(zip(first, other)) if a != b), min(len(first), len(other))
                )
                raise self.fail(
                    f"not deterministic: two sessions of sample {index} given the same actions "
                    f"diverged at {_entry_name(first, other, position)}: "
                    f"{short(_entry(first, position))} vs {short(_entry(other, position))}; "
                    f"seed any randomness from the sample's row and keep no state between sessions"
                )
        tools = first[0][2]
        if tools:
            await self.check_invalid_calls(index, sample, tools)

    async def episode(self, index: int, sample: Sample) -> list[tuple[Any, ...]]:
        """Play one scripted episode, checking every return value; the transcript to compare."""
        session = self.open(sample)
        try:
            reset = await self.call(f"reset (sample {index})", session.reset, sample)
            tools = check_reset(reset, f"reset (sample {index})", self.fail)
            images = getattr(self.env, "produces_images", False)
            check_images(reset.prompt, images, f"reset (sample {index})", self.fail)
            transcript: list[tuple[Any, ...]] = [("reset", _messages_key(reset.prompt), tools, reset.stop)]
            rng = random.Random(f"{self.seed}:{index}")
            conversation = list(reset.prompt)
            for turn in range(1, self.steps + 1):
                conversation.append(scripted_action(rng, turn, tools))
                where = f"step {turn} (sample {index})"
                step = await self.call(where, session.step, tuple(conversation))
                check_step(step, where, self.fail)
                check_images(step.messages, images, where, self.fail)
                conversation.extend(step.messages)
                transcript.append(("step", *_step_key(step), self.metadata(session, where)))
                if step.ending:
                    break
            final = await self.call(f"finish (sample {index})", session.finish)
            check_reward(final, f"finish (sample {index})", "the final reward", self.fail)
            transcript.append(("finish", final))
        except BaseException:
            with contextlib.suppress(Exception):  # the broken rule is the error worth reporting
                await session.close()
            raise
        await self.check_close(session, index)
        return transcript

    def metadata(self, session: EnvSession, where: str) -> str | None:
        """The session's metadata as JSON when it is plain data, so that runs can be compared."""
        try:
            value = session.metadata
        except Exception as exc:
            raise self.fail(f"reading session.metadata after {where} raised {_describe(exc)}") from exc
        try:
            return json.dumps(value, sort_keys=True)
        except (TypeError, ValueError):
            return None

    async def check_close(self, session: EnvSession, index: int) -> None:
        await self.call(f"close (sample {index})", session.close)
        await self.call(f"a second close (sample {index}), which must be harmless,", session.close)

    # -- rule 7 ----------------------------------------------------------------------------------

    def check_trivial_answers(
        self, samples: Sequence[Sample], trivial: Callable[[Sample], tuple[str, float]]
    ) -> tuple[str, float]:
        scores = [(trivial(sample), index) for index, sample in enumerate(samples)]
        (label, score), index = max(scores, key=lambda item: item[0][1])
        if score > TRIVIAL_ANSWER_LIMIT:
            raise self.fail(
                f"an answer that ignores the task ({label}) scores {score:.2f} on sample {index}, above "
                f"{TRIVIAL_ANSWER_LIMIT}; add hidden tests that it fails"
            )
        return label, score

    # -- rule 6 ----------------------------------------------------------------------------------

    async def check_invalid_calls(self, index: int, sample: Sample, tools: tuple[str, ...]) -> None:
        functions = [json.loads(t)["function"] for t in tools]
        rng = random.Random(f"{self.seed}:{index}:invalid")
        target = rng.choice(functions)
        bad_arguments = invalid_arguments(rng, target.get("parameters", {}))
        calls = {
            "a call to an unknown tool": ToolCall(name=_UNKNOWN_TOOL, arguments={}, id="call_bad"),
            f"a call to {target['name']} with invalid arguments {short(bad_arguments)}": ToolCall(
                name=target["name"], arguments=bad_arguments, id="call_bad"
            ),
            "an unparseable tool call": ToolCall(
                name="", arguments={}, id="call_bad", error="invalid JSON: Expecting ',' delimiter"
            ),
        }
        for what, call in calls.items():
            session = self.open(sample)
            try:
                reset = await self.call(f"reset (sample {index})", session.reset, sample)
                conversation = (*reset.prompt, tool_call_message(call))
                where = f"step with {what} (sample {index})"
                step = await self.call(
                    f"{where}, which must report a failure rather than raise,", session.step, conversation
                )
                check_step(step, where, self.fail)
                if not step.failures:
                    raise self.fail(f"{where}: the Step has no failure; bad tool calls must be counted")
                if not step.messages:
                    raise self.fail(f"{where}: the Step has no message; the model must be told what went wrong")
            except BaseException:
                with contextlib.suppress(Exception):  # the broken rule is the error worth reporting
                    await session.close()
                raise
            await self.check_close(session, index)


# -- transcripts -----------------------------------------------------------------------------------


def _messages_key(messages: Sequence[Message]) -> tuple[Any, ...]:
    return tuple(
        (m.role, m.content, m.name, as_json(m.to_json().get("tool_calls")), image_digests(m)) for m in messages
    )


def _step_key(step: Step) -> tuple[Any, ...]:
    return (
        _messages_key(step.messages),
        step.reward,
        step.ending,
        step.stop,
        tuple(f.kind for f in step.failures),
    )


def _entry(transcript: list[tuple[Any, ...]], position: int) -> Any:
    return transcript[position] if position < len(transcript) else "(episode already over)"


def _entry_name(first: list[tuple[Any, ...]], other: list[tuple[Any, ...]], position: int) -> str:
    longer = first if position < len(first) else other
    kind = longer[position][0]
    return f"step {position}" if kind == "step" else kind


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
