"""One episode's turn loop: render -> generate -> parse tool calls -> step the environment -> append.

This is the heart of rollforge. It sees the backend and the environment only through their
protocols and the chat template only through ``ChatRenderer``. Token bookkeeping:

    ids   = prompt | gen-prompt | generated (policy) | closing + observation | gen-prompt | ...
    mask  =   0    |     0      |         1          |           0           |     0      | ...

Generated ids are kept exactly as the backend returned them; everything else is rendered
incrementally. For a chat template that rewrites history (``ChatRenderer.report(...).incremental``
is False, e.g. Qwen3 dropping past reasoning) each turn renders the whole conversation instead:
when the ids so far are a prefix of it, the rest is appended; otherwise the episode continues in a
new segment whose prompt is that rendering (mask 0). Tool calls without an id get the family's
deterministic one. Each turn the environment is stepped with the conversation so far; its reward
is the turn's reward. The episode ends when the environment terminates it (natural termination),
when an observation or generation reaches ``max_seq_len`` (the observation is cut to what fits and
its message to the text the kept ids hold: truncated), after ``max_turns`` (max-turns-reached), or
on a failure (recorded as ``error`` with its reason, keeping every token produced so far). Scheduling (lockstep barriers) comes in through ``Gate``.
Images in messages go to backends that declare ``accepts_images`` (``generate(..., images=...)``,
all images so far in order); with a text-only backend they fail the episode with that reason.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Protocol, Sequence, TypeVar

from ..backends.base import CURRENT_EPISODE, Backend, SamplingParams
from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser
from ..envs.base import Environment
from ..errors import TemplateError
from ..types import Failure, Message, Sample, Segment, ToolCall, Trajectory
from .config import RolloutConfig

T = TypeVar("T")


class Gate(Protocol):
    """Where the scheduler may hold an episode: before each generation and each environment step.
    ``leave`` is called once when the episode ends."""

    async def wait(self, phase: str) -> None: ...

    def leave(self) -> None: ...


class OpenGate:
    """Async per-sample scheduling: never holds anyone."""

    async def wait(self, phase: str) -> None:
        return None

    def leave(self) -> None:
        return None


@dataclass
class EpisodeContext:
    backend: Backend
    renderer: ChatRenderer
    parser: ToolCallParser
    config: RolloutConfig
    #: The backend takes ``generate(..., images=...)`` (it declares ``accepts_images = True``).
    accepts_images: bool = field(init=False)

    def __post_init__(self) -> None:
        self.accepts_images = bool(getattr(self.backend, "accepts_images", False))


def _check_images(messages: Sequence[Message], ctx: EpisodeContext) -> None:
    """Images reaching a text-only backend end the episode with a clear reason (the environment
    did not declare ``produces_images``, or the engine would have refused to start)."""
    if ctx.accepts_images:
        return
    count = sum(len(m.images) for m in messages)
    if count:
        raise _Stop(Failure(
            "env_error",
            f"the environment returned {count} image(s) but the backend {type(ctx.backend).__name__} is "
            "text-only (accepts_images=False); declare produces_images=True on the environment to have "
            "this checked before the rollout starts",
        ))


class _Stop(Exception):
    """Ends the episode with a failure recorded on the trajectory."""

    def __init__(self, failure: Failure):
        self.failure = failure


@dataclass
class _State:
    """What the episode has produced so far; survives cancellation so nothing is lost."""

    index: int
    sample: Sample
    messages: list[Message] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    prompt_length: int = 0
    rewards: list[float] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    tools: tuple = ()  # the tool schemas the template renders
    ending: str = ""  # terminated | truncated | max_turns_reached | "" (error)
    error: Failure | None = None
    generation_seconds: float = 0.0
    environment_seconds: float = 0.0
    #: Finished segments (the current one is ``ids`` / ``mask`` / ``logprobs`` / ``prompt_length``).
    segments: list[Segment] = field(default_factory=list)
    #: How many messages the current segment's ids render (set when a segment closes).
    covered: int = 0
    #: How many messages the last segment renders, when the episode ended with messages after it.
    last_covers: int | None = None

    def new_segment(self, prompt_ids: list[int]) -> None:
        """Close the current segment (it renders the first ``covered`` messages) and start one
        whose prompt is ``prompt_ids``."""
        self.segments.append(Segment(tuple(self.ids), tuple(self.mask), tuple(self.logprobs), self.prompt_length, self.covered))
        self.ids, self.mask, self.logprobs = [], [], []
        self.extend(prompt_ids)
        self.prompt_length = len(prompt_ids)

    def extend(self, ids: list[int], logprobs: tuple[float, ...] | None = None) -> None:
        self.ids += ids
        if logprobs is None:
            self.mask += [0] * len(ids)
            self.logprobs += [None] * len(ids)
        else:
            self.mask += [1] * len(ids)
            self.logprobs += logprobs

    def trajectory(self, session: Any) -> Trajectory:
        ids, mask, logprobs, prompt_length = self.ids, self.mask, self.logprobs, self.prompt_length
        segments: tuple[Segment, ...] = ()
        if self.segments or self.last_covers is not None:
            covers = len(self.messages) if self.last_covers is None else self.last_covers
            segments = (*self.segments, Segment(tuple(ids), tuple(mask), tuple(logprobs), prompt_length, covers))
            ids = [t for s in segments for t in s.token_ids]
            mask = [b for s in segments for b in s.loss_mask]
            logprobs = [lp for s in segments for lp in s.logprobs]
            prompt_length = segments[0].prompt_length
        return Trajectory(
            index=self.index,
            task_name=self.sample.task_name,
            messages=tuple(self.messages),
            token_ids=tuple(ids),
            loss_mask=tuple(mask),
            logprobs=tuple(logprobs),
            prompt_length=prompt_length,
            rewards=tuple(self.rewards),
            total_reward=float(sum(self.rewards)),
            turns=len(self.rewards),
            terminated=self.ending == "terminated",
            truncated=self.ending == "truncated",
            max_turns_reached=self.ending == "max_turns_reached",
            error=self.error,
            failures=tuple(self.failures),
            metadata=session.metadata if session is not None else None,
            tools=self.tools,
            generation_seconds=self.generation_seconds,
            environment_seconds=self.environment_seconds,
            environment=session.handle if session is not None else None,
            segments=segments,
        )


async def run_episode(index: int, sample: Sample, env: Environment, ctx: EpisodeContext, gate: Gate) -> Trajectory:
    """Run one episode to its end; never raises for a failure inside the episode."""
    state = _State(index, sample)
    CURRENT_EPISODE.set(state)  # this episode's own task: routers keep its turns on one replica
    session = None
    try:
        session = env.open(sample)
        async with asyncio.timeout(ctx.config.episode_timeout):
            await _turns(state, session, ctx, gate)
    except _Stop as stop:
        state.error, state.ending = stop.failure, ""
    except TimeoutError:
        state.error, state.ending = Failure("episode_timeout", f"episode exceeded {ctx.config.episode_timeout}s"), ""
    except TemplateError as exc:
        state.error, state.ending = Failure("template_error", str(exc)), ""
    except Exception as exc:  # the environment's own open() or a bug in an adapter
        state.error, state.ending = Failure("env_error", f"{type(exc).__name__}: {exc}"), ""
    finally:
        gate.leave()
        if session is not None:
            await _close(state, session, ctx)
    return state.trajectory(session)


async def _turns(state: _State, session: Any, ctx: EpisodeContext, gate: Gate) -> None:
    config, renderer = ctx.config, ctx.renderer
    reset = await _env_call(state, session.reset(state.sample), "reset", config)
    stop = reset.stop if reset.stop is not None else state.sample.stop
    prompt, template_tools = renderer.with_tool_prompt(reset.prompt, reset.tools, ctx.parser)
    state.tools = template_tools
    state.messages += prompt
    _check_images(prompt, ctx)  # after keeping them: a failed trajectory still shows the images
    incremental = renderer.report(reset.tools, ctx.parser).incremental
    state.extend(renderer.prompt_ids(prompt, template_tools))
    state.prompt_length = len(state.ids)
    pending = renderer.generation_prompt  # appended before the next generation

    for turn in range(config.max_turns):
        state.extend(pending)
        budget = min(config.max_new_tokens, config.max_seq_len - len(state.ids))
        if budget <= 0:
            _cut_to(state, config.max_seq_len)
            state.ending = "truncated"
            return
        await gate.wait("generate")
        completion = await _generate(state, ctx, _params(config, budget, stop, renderer, state.index, turn))
        generated = list(completion.token_ids)
        state.extend(generated, completion.logprobs)
        text = renderer.decode(renderer.content_ids(generated))
        calls = _with_ids(ctx.parser.parse(text), renderer, state.index, turn)
        state.messages.append(Message("assistant", text, tool_calls=calls))

        await gate.wait("step")
        step = await _env_call(state, session.step(tuple(state.messages)), "step", config)
        state.rewards.append(float(step.reward))
        state.failures += step.failures
        covered = len(state.messages)
        state.messages += step.messages
        _check_images(step.messages, ctx)
        if step.terminated and not step.messages:
            observation = []  # the episode ends on the policy's own tokens
        elif incremental:
            observation = renderer.closing_ids(generated) + renderer.delta_ids(step.messages, template_tools)
            pending = renderer.generation_prompt
        else:  # the whole conversation, rendered as the template does: appended, or a new segment
            whole = renderer.conversation_ids(state.messages, template_tools, add_generation_prompt=not step.terminated)
            pending = []
            if whole[: len(state.ids)] == state.ids:
                observation = whole[len(state.ids) :]
            elif step.terminated:  # no segment to start: the last one renders the messages before
                state.last_covers = covered
                state.ending = "terminated"
                return
            elif len(whole) >= config.max_seq_len:
                del state.messages[covered:]  # nothing of them is in the ids
                state.ending = "truncated"
                return
            else:
                state.covered = covered
                state.new_segment(whole)
                if step.stop is not None:
                    stop = step.stop
                continue
        if len(state.ids) + len(observation) >= config.max_seq_len and (observation or not step.terminated):
            kept = observation[: config.max_seq_len - len(state.ids)]
            state.extend(kept)
            _keep_what_fits(state, covered, kept, renderer)
            state.ending = "truncated"
            return
        state.extend(observation)
        if step.terminated:
            state.ending = "terminated"
            return
        if step.stop is not None:
            stop = step.stop
    state.ending = "max_turns_reached"


def _with_ids(calls: tuple[ToolCall, ...], renderer: ChatRenderer, episode: int, turn: int) -> tuple[ToolCall, ...]:
    """Calls whose format carries no id get the family's deterministic one (templates such as
    Mistral's pair results with calls by id)."""
    if all(c.id is not None for c in calls):
        return calls
    return tuple(
        c if c.id is not None else replace(c, id=renderer.family.call_id(episode, turn, k)) for k, c in enumerate(calls)
    )


def _keep_what_fits(state: _State, covered: int, kept: list[int], renderer: ChatRenderer) -> None:
    """After an observation was cut to ``kept`` ids, make the step's messages hold only the text
    those ids hold: messages that fit whole stay, the one cut keeps the text before the cut, the
    rest are dropped (a 2 MB observation cut to 100 tokens leaves 100 tokens of text). A message
    the template does not render verbatim (Llama quotes tool results as JSON) is dropped once cut."""
    messages = state.messages[covered:]
    del state.messages[covered:]
    text = renderer.decode(kept).rstrip("\ufffd")  # a cut may split a multi-byte character
    at = 0
    for message in messages:
        start = text.find(message.content[:64], at)
        if start < 0:
            return
        held = text[start : start + len(message.content)]
        if held != message.content:
            if held and message.content.startswith(held):
                state.messages.append(replace(message, content=held, images=()))
            return
        state.messages.append(message)
        at = start + len(held)


def _params(config: RolloutConfig, budget: int, stop, renderer: ChatRenderer, index: int, turn: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=budget,
        temperature=0.0 if config.greedy else config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        stop=tuple(stop),
        stop_token_ids=renderer.stop_token_ids,
        seed=((config.seed * 1_000_003 + index) * 1_000_033 + turn) % (2**31 - 1),
    )


async def _generate(state: _State, ctx: EpisodeContext, params: SamplingParams):
    started = time.perf_counter()
    try:
        if ctx.accepts_images:  # every image of the conversation so far, in order
            images = tuple(image for m in state.messages for image in m.images)
            return await ctx.backend.generate(state.ids, params, images=images)
        return await ctx.backend.generate(state.ids, params)
    except Exception as exc:
        raise _Stop(Failure("backend_error", f"{type(exc).__name__}: {exc}")) from exc
    finally:
        state.generation_seconds += time.perf_counter() - started


async def _env_call(state: _State, call: Awaitable[T], what: str, config: RolloutConfig) -> T:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(config.step_timeout):
            return await call
    except TimeoutError:
        raise _Stop(Failure("env_timeout", f"environment {what} exceeded the step timeout of {config.step_timeout}s")) from None
    except _Stop:
        raise
    except Exception as exc:
        raise _Stop(Failure("env_error", f"environment {what} raised {type(exc).__name__}: {exc}")) from exc
    finally:
        state.environment_seconds += time.perf_counter() - started


async def _close(state: _State, session: Any, ctx: EpisodeContext) -> None:
    """Add the final reward (``get_reward``) to the last turn, then close; failures here are kept."""
    if state.error is None and state.rewards:
        try:
            bonus = await _env_call(state, session.finish(), "finish", ctx.config)
            state.rewards[-1] += float(bonus)
        except _Stop as stop:
            state.error, state.ending = stop.failure, ""
    try:
        await _env_call(state, session.close(), "close", ctx.config)
    except _Stop as stop:
        state.failures.append(stop.failure)


def _cut_to(state: _State, limit: int) -> None:
    del state.ids[limit:], state.mask[limit:], state.logprobs[limit:]
    state.prompt_length = min(state.prompt_length, limit)

