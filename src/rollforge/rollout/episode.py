"""One episode's turn loop: render -> generate -> parse tool calls -> step the environment -> append.

This is the heart of rollforge. It sees the backend and the environment only through their
protocols and the chat template only through ``ChatRenderer``. Its tokens go into the token ledger
(``rollout/ledger.py``): generated ids exactly as the backend returned them, everything else
rendered incrementally. For a chat template that rewrites history (``ChatRenderer.report(...)
.incremental`` is False, e.g. Qwen3 dropping past reasoning) each turn renders the whole
conversation instead: when the ids so far are a prefix of it, the rest is appended; otherwise the
episode continues in a new segment whose prompt is that rendering (mask 0). Tool calls without an id get the family's
deterministic one. Each turn the environment is stepped with the conversation so far; its reward
is the turn's reward. The episode ends when the environment terminates it (natural termination)
or truncates it (``Step.truncated``: its own limit cut the task off), when an observation or
generation reaches ``max_seq_len`` (the observation is cut to what fits and
its message to the text the kept ids hold: truncated), after ``max_turns`` (max-turns-reached), or
on a failure (recorded as ``error`` with its reason, keeping every token produced so far).
Scheduling (lockstep barriers) comes in through ``Gate``.

Failures: each call across a boundary is classified by ``boundary.boundary`` (the backend's
``generate`` as ``backend_error``, environment calls as ``env_error``; a call past the step timeout
as ``env_timeout``, the whole episode past ``episode_timeout`` as ``episode_timeout``, a
conversation the chat template cannot render as ``template_error``). rollforge's own bugs are not
failures of the episode: they propagate and stop the rollout. A generation call is bounded by
``request_timeout``; a completion with a token id outside the tokenizer's vocabulary is a
``backend_error``. Tool-call parsing of long replies, and tokenizing long observations, run on
worker threads, off the event loop (same results).
Images in messages go to backends that declare ``accepts_images`` (``generate(..., images=...)``,
all images so far in order); with a text-only backend they fail the episode with that reason.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Protocol, Sequence, TypeVar

from ..backends.base import CURRENT_EPISODE, Backend, SamplingParams
from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser
from ..envs.base import Environment
from ..boundary import boundary
from ..errors import EpisodeFailed, TemplateError
from ..seeds import sampling_seed
from ..types import Ending, Failure, Message, Sample, ToolCall, Trajectory
from ..workers import RENDER_WORKERS, run_blocking
from .config import RolloutConfig
from .deadlines import deadline
from .ledger import Ledger

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


#: Replies longer than this (characters) are parsed for tool calls on a worker thread.
PARSE_INLINE_CHARS = 4096
#: Observations longer than this (characters) are tokenized on the render thread: the Rust
#: tokenizer releases the GIL, so the encode runs beside the event loop instead of on it.
RENDER_INLINE_CHARS = 256


@dataclass
class EpisodeContext:
    backend: Backend
    renderer: ChatRenderer
    parser: ToolCallParser
    config: RolloutConfig
    #: The backend takes ``generate(..., images=...)`` (``Backend.accepts_images``).
    accepts_images: bool = field(init=False)
    #: Token ids at or above this are outside the tokenizer's vocabulary.
    vocab_size: int = field(init=False)
    _render_slot: asyncio.Semaphore | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.accepts_images = self.backend.accepts_images
        self.vocab_size = len(self.renderer.tokenizer)

    async def delta_ids(self, messages: Sequence[Message], tools: Sequence[Any]) -> list[int]:
        """``renderer.delta_ids``: short observations inline, longer ones on the render thread
        (one at a time: the other core stays with the event loop). Same ids either way."""
        if sum(len(m.content) for m in messages) <= RENDER_INLINE_CHARS:
            return self.renderer.delta_ids(messages, tools)
        if self._render_slot is None:
            self._render_slot = asyncio.Semaphore(1)
        async with self._render_slot:
            return await RENDER_WORKERS.run(self.renderer.delta_ids, messages, tools)

    async def parse(self, text: str) -> tuple[ToolCall, ...]:
        """The tool calls of a reply; long replies are parsed on a worker thread so that no
        reply, however pathological, holds the event loop."""
        if len(text) <= PARSE_INLINE_CHARS:
            return self.parser.parse(text)
        return await run_blocking(self.parser.parse, text)


def _fail_on_images_for_text_backend(messages: Sequence[Message], ctx: EpisodeContext) -> None:
    """Images reaching a text-only backend end the episode with a clear reason (the environment
    did not declare ``produces_images``, or the engine would have refused to start)."""
    if ctx.accepts_images:
        return
    count = sum(len(m.images) for m in messages)
    if count:
        raise EpisodeFailed(
            Failure(
                "env_error",
                f"the environment returned {count} image(s) but the backend {type(ctx.backend).__name__} is "
                "text-only (accepts_images=False); declare produces_images=True on the environment to have "
                "this checked before the rollout starts",
            )
        )


@dataclass
class _State:
    """What the episode has produced so far; survives cancellation so nothing is lost."""

    index: int
    sample: Sample
    messages: list[Message] = field(default_factory=list)
    tokens: Ledger = field(default_factory=Ledger)
    prompt_messages: int | None = None
    rewards: list[float] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    tools: tuple = ()  # the tool schemas the template renders
    ending: Ending | None = None  # None while the episode runs
    error: Failure | None = None
    generation_seconds: float = 0.0
    environment_seconds: float = 0.0
    #: How many messages the last segment renders, when the episode ended with messages after it.
    last_covers: int | None = None

    def trajectory(self, session: Any) -> Trajectory:
        return Trajectory(
            index=self.index,
            task_name=self.sample.task_name,
            messages=tuple(self.messages),
            **self.tokens.fields(self.messages, self.last_covers),
            prompt_messages=self.prompt_messages,
            rewards=tuple(self.rewards),
            total_reward=float(sum(self.rewards)),
            turns=len(self.rewards),
            ending=self.ending,  # type: ignore[arg-type]  # set once the episode ended
            error=self.error,
            failures=tuple(self.failures),
            metadata=session.metadata if session is not None else None,
            tools=self.tools,
            generation_seconds=self.generation_seconds,
            environment_seconds=self.environment_seconds,
            environment=session.handle if session is not None else None,
        )


async def run_episode(index: int, sample: Sample, env: Environment, ctx: EpisodeContext, gate: Gate) -> Trajectory:
    """Run one episode to its end; never raises for a failure inside the episode."""
    state = _State(index, sample)
    CURRENT_EPISODE.set(state)  # this episode's own task: routers keep its turns on one replica
    session = None
    try:
        with boundary("environment", "environment open"):
            session = env.open(sample)
        async with deadline(ctx.config.episode_timeout):
            await _turns(state, session, ctx, gate)
    except EpisodeFailed as failed:
        state.error, state.ending = failed.failure, "error"
    except TimeoutError:
        state.error, state.ending = (
            Failure("episode_timeout", f"episode exceeded {ctx.config.episode_timeout}s"),
            "error",
        )
    except TemplateError as exc:
        state.error, state.ending = Failure("template_error", str(exc)), "error"
    # anything else is a bug in rollforge: it propagates (boundary.is_own_bug)
    finally:
        gate.leave()
        if session is not None:
            await _close(state, session, ctx)
    return state.trajectory(session)


async def _turns(state: _State, session: Any, ctx: EpisodeContext, gate: Gate) -> None:
    config, renderer, tokens = ctx.config, ctx.renderer, state.tokens
    reset = await _env_call(state, session.reset(state.sample), "reset", config)
    stop = reset.stop if reset.stop is not None else state.sample.stop
    prompt, state.tools = renderer.with_tool_prompt(reset.prompt, reset.tools, ctx.parser)
    state.messages += prompt
    _fail_on_images_for_text_backend(prompt, ctx)  # after keeping them: a failed trajectory still shows the images
    incremental = renderer.report(reset.tools, ctx.parser).incremental
    tokens.begin(renderer.prompt_ids(prompt, state.tools))
    pending = renderer.generation_prompt  # appended before the next generation
    state.prompt_messages = len(state.messages)

    for turn in range(config.max_turns):
        tokens.extend(pending)
        budget = min(config.max_new_tokens, config.max_seq_len - len(tokens.ids))
        if budget <= 0:
            tokens.cut_to(config.max_seq_len)
            state.ending = "truncated"
            return
        await gate.wait("generate")
        completion = await _generate(state, ctx, _params(config, budget, stop, renderer, state.index, turn))
        generated = list(completion.token_ids)
        tokens.extend(generated, completion.logprobs, completion.version)
        text = renderer.decode(renderer.content_ids(generated))
        calls = _with_ids(await ctx.parse(text), renderer, state.index, turn)
        state.messages.append(Message("assistant", text, tool_calls=calls))

        await gate.wait("step")
        step = await _env_call(state, session.step(tuple(state.messages)), "step", config)
        state.rewards.append(float(step.reward))
        state.failures += step.failures
        covered = len(state.messages)
        state.messages += step.messages
        _fail_on_images_for_text_backend(step.messages, ctx)
        observation = await _observation(state, step, covered, generated, incremental, ctx)
        if observation is None:  # the episode ended, or went on in a new segment
            if state.ending:
                return
        elif _append(state, observation, covered, step.ending, ctx):
            return
        pending = renderer.generation_prompt if incremental else []
        if step.stop is not None:
            stop = step.stop
    state.ending = "max_turns_reached"


async def _observation(
    state: _State, step: Any, covered: int, generated: list[int], incremental: bool, ctx: EpisodeContext
) -> list[int] | None:
    """The ids to append after a turn; None when there are none to append because the episode
    ended (``state.ending`` set) or the conversation went on in a new segment."""
    renderer, tokens = ctx.renderer, state.tokens
    if step.ending and not step.messages:
        return []  # the episode ends on the policy's own tokens
    if incremental:
        return renderer.closing_ids(generated) + await ctx.delta_ids(step.messages, state.tools)
    # the whole conversation, rendered as the template does: appended, or a new segment
    whole = renderer.conversation_ids(state.messages, state.tools, add_generation_prompt=not step.ending)
    if whole[: len(tokens.ids)] == tokens.ids:
        return whole[len(tokens.ids) :]
    if step.ending:  # no segment to start: the last one renders the messages before
        state.last_covers, state.ending = covered, step.ending
    elif len(whole) >= ctx.config.max_seq_len:
        del state.messages[covered:]  # nothing of them is in the ids
        state.ending = "truncated"
    else:
        tokens.close(state.messages[:covered])
        tokens.begin(whole)
    return None


def _append(state: _State, observation: list[int], covered: int, ended: Ending | None, ctx: EpisodeContext) -> bool:
    """Append a turn's observation, cut to what fits; True when the episode ended (``ended``: how
    the environment ended it, None when it goes on)."""
    tokens, limit = state.tokens, ctx.config.max_seq_len
    if len(tokens.ids) + len(observation) >= limit and (observation or not ended):
        kept = observation[: limit - len(tokens.ids)]
        tokens.extend(kept)
        _keep_what_fits(state, covered, kept, ctx.renderer)
        state.ending = "truncated"
        return True
    tokens.extend(observation)
    if ended:
        state.ending = ended
    return ended is not None


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
        seed=sampling_seed(config.seed, index, turn),
    )


async def _generate(state: _State, ctx: EpisodeContext, params: SamplingParams):
    started = time.perf_counter()
    limit = deadline(ctx.config.request_timeout)
    try:
        with boundary("backend", None):
            async with limit:
                if ctx.accepts_images:  # every image of the conversation so far, in order
                    images = tuple(image for m in state.messages for image in m.images)
                    completion = await ctx.backend.generate(state.tokens.ids, params, images=images)
                else:
                    completion = await ctx.backend.generate(state.tokens.ids, params)
    except EpisodeFailed:
        if limit.expired():
            raise EpisodeFailed(
                Failure(
                    "backend_error",
                    f"generation exceeded the request timeout of {ctx.config.request_timeout}s",
                )
            ) from None
        raise
    finally:
        state.generation_seconds += time.perf_counter() - started
    ids = completion.token_ids
    if ids and (min(ids) < 0 or max(ids) >= ctx.vocab_size):  # min/max: C speed on long replies
        bad = next(i for i in ids if not 0 <= i < ctx.vocab_size)
        raise EpisodeFailed(
            Failure(
                "backend_error",
                f"the backend returned token id {bad}, outside the vocabulary of {ctx.vocab_size} tokens",
            )
        )
    return completion


async def _env_call(state: _State, call: Awaitable[T], what: str, config: RolloutConfig) -> T:
    started = time.perf_counter()
    limit = deadline(config.step_timeout)
    try:
        with boundary("environment", f"environment {what}"):
            async with limit:
                return await call
    except EpisodeFailed:
        if limit.expired():
            raise EpisodeFailed(
                Failure(
                    "env_timeout",
                    f"environment {what} exceeded the step timeout of {config.step_timeout}s",
                )
            ) from None
        raise
    finally:
        state.environment_seconds += time.perf_counter() - started


async def _close(state: _State, session: Any, ctx: EpisodeContext) -> None:
    """Add the final reward (``get_reward``) to the last turn, then close; failures here are kept."""
    if state.error is None and state.rewards:
        try:
            bonus = await _env_call(state, session.finish(), "finish", ctx.config)
            state.rewards[-1] += _finite(bonus, "finish")
        except EpisodeFailed as failed:
            state.error, state.ending = failed.failure, "error"
    try:
        await _env_call(state, session.close(), "close", ctx.config)
    except EpisodeFailed as failed:
        state.failures.append(failed.failure)


def _finite(reward: Any, what: str) -> float:
    """A reward as a float; NaN, infinities and non-numbers are the environment's error."""
    try:
        value = float(reward) if not isinstance(reward, (str, bytes, bool)) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise EpisodeFailed(
            Failure("env_error", f"environment {what} returned the reward {reward!r}; expected a finite number")
        )
    return value
