"""The calls one episode makes across its boundaries, each bounded in time and classified.

Every call goes through ``boundary.boundary``: the backend's ``generate`` files what it raises as
``backend_error``, environment calls (reset, step, finish, close) as ``env_error``. A generation past
``request_timeout`` is a ``backend_error`` that says so, an environment call past ``step_timeout`` an
``env_timeout``. A prompt the backend refuses as longer than the model's positions
(``ContextExceeded``) is ``context_exceeded``: the episode's own fault, which a rerun repeats, so it
is a policy failure and never retried (``endings.py``). A completion with a token id outside the
tokenizer's vocabulary is a ``backend_error``; a reward that is not a finite number the
environment's ``env_error``. Each call's wall time is added to the episode's generation or
environment seconds, failed calls included; the Ray replica that returned a completion, if any
(``Completion.served_by``), is kept as the episode's ``generated_on``.

Images in messages go to backends that declare ``accepts_images`` (``generate(..., images=...)``,
all images so far in order); with a text-only backend they fail the episode with that reason
(``check_images``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Awaitable, Sequence, TypeVar

from ..backends.base import SamplingParams
from ..boundary import boundary
from ..errors import ContextExceeded, EpisodeFailed
from ..types import Completion, Failure, Message
from .config import RolloutConfig
from .context import EpisodeContext, EpisodeState
from .deadlines import deadline

T = TypeVar("T")


async def generate(state: EpisodeState, ctx: EpisodeContext, params: SamplingParams) -> Completion:
    """The backend's completion of the episode's ids so far (see the module docstring)."""
    started = time.perf_counter()
    limit = deadline(ctx.config.request_timeout)
    try:
        with boundary("backend", None):
            async with limit:
                completion = await _request(state, ctx, params)
    except EpisodeFailed:
        if limit.expired():
            raise EpisodeFailed(
                Failure("backend_error", f"generation exceeded the request timeout of {ctx.config.request_timeout}s")
            ) from None
        raise
    finally:
        state.generation_seconds += time.perf_counter() - started
    state.generated_on = completion.served_by
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


async def _request(state: EpisodeState, ctx: EpisodeContext, params: SamplingParams) -> Completion:
    try:
        if ctx.accepts_images:  # every image of the conversation so far, in order
            images = tuple(image for m in state.messages for image in m.images)
            return await ctx.backend.generate(state.tokens.ids, params, images=images)
        return await ctx.backend.generate(state.tokens.ids, params)
    except ContextExceeded as exc:  # no rerun fits it in: the episode's fault, not the machinery's
        raise EpisodeFailed(
            Failure(
                "context_exceeded",
                f"{exc}; lower max_seq_len to the model's positions (then such a prompt is cut as truncated) "
                "or shorten the prompts",
            )
        ) from None


async def env_call(state: EpisodeState, call: Awaitable[T], what: str, config: RolloutConfig) -> T:
    """``call`` (the environment's ``what``: reset, step, finish, close) under the step timeout."""
    started = time.perf_counter()
    limit = deadline(config.step_timeout)
    try:
        with boundary("environment", f"environment {what}"):
            async with limit:
                return await call
    except EpisodeFailed:
        if limit.expired():
            raise EpisodeFailed(
                Failure("env_timeout", f"environment {what} exceeded the step timeout of {config.step_timeout}s")
            ) from None
        raise
    finally:
        state.environment_seconds += time.perf_counter() - started


def check_images(messages: Sequence[Message], ctx: EpisodeContext) -> None:
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


async def finish_and_close(state: EpisodeState, session: Any, ctx: EpisodeContext) -> None:
    """Add the final reward (``get_reward``) to the last turn, then close; failures here are kept."""
    if state.error is None and state.rewards:
        try:
            bonus = await env_call(state, session.finish(), "finish", ctx.config)
            state.rewards[-1] += finite(bonus, "finish")
        except EpisodeFailed as failed:
            state.fail(failed.failure)
    try:
        await env_call(state, session.close(), "close", ctx.config)
    except EpisodeFailed as failed:
        state.failures.append(failed.failure)


def finite(reward: Any, what: str) -> float:
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
