"""One episode's turn loop: render -> generate -> parse tool calls -> step the environment -> append.

This is the heart of rollforge. It sees the backend and the environment only through their
protocols and the chat template only through ``ChatRenderer``. Its tokens go into the token ledger
(``rollout/ledger.py``): generated ids exactly as the backend returned them, everything else
rendered incrementally. For a chat template that rewrites history (``ChatRenderer.report(...)
.incremental`` is False, e.g. Qwen3 dropping past reasoning) each turn renders the whole
conversation instead: when the ids so far are a prefix of it, the rest is appended; otherwise the
episode continues in a new segment whose prompt is that rendering (mask 0). Tool calls without an
id get the family's deterministic one. Each turn the environment is stepped with the conversation
so far; its reward is the turn's reward.

The episode ends when the environment terminates it (natural termination) or truncates it
(``Step.truncated``: its own limit cut the task off); when an observation or generation reaches
``max_seq_len`` (the observation is cut to what fits and its message to the text the kept ids
hold: truncated); after ``max_turns`` (max-turns-reached); or on a failure (recorded as ``error``
with its reason, keeping every token produced so far). A reply cut at its token budget
(``finish_reason`` ``length``) after which the environment ends the episode ends it as
``truncated``, not ``terminated``: the environment judged a reply a limit cut off, so the state it
stopped in is not the task's end. Scheduling (lockstep barriers) comes in through ``Gate``.

What the episode runs with and what it has produced are ``context.py``; the calls it makes across
boundaries, each bounded in time and classified (``backend_error``, ``env_error``,
``env_timeout``, ``context_exceeded``), are ``calls.py``. The whole episode past
``episode_timeout`` is an ``episode_timeout`` failure, a conversation the chat template cannot
render a ``template_error``. rollforge's own bugs are not failures of the episode: they propagate
and stop the rollout. Tool-call parsing of long replies, and tokenizing long observations, run on
worker threads, off the event loop (same results).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..backends.base import CURRENT_EPISODE, SamplingParams
from ..boundary import boundary
from ..chat.render import ChatRenderer
from ..envs.base import Environment
from ..errors import EpisodeFailed, TemplateError
from ..seeds import sampling_seed
from ..types import Ending, Failure, Message, Sample, ToolCall, Trajectory
from .calls import check_images, env_call, finish_and_close, generate
from .config import RolloutConfig
from .context import EpisodeContext, EpisodeState, Gate
from .deadlines import deadline


async def run_episode(index: int, sample: Sample, env: Environment, ctx: EpisodeContext, gate: Gate) -> Trajectory:
    """Run one episode to its end; never raises for a failure inside the episode."""
    state = EpisodeState(index, sample)
    CURRENT_EPISODE.set(state)  # this episode's own task: routers keep its turns on one replica
    session = None
    try:
        with boundary("environment", "environment open"):
            session = env.open(sample)
        async with deadline(ctx.config.episode_timeout):
            await _turns(state, session, ctx, gate)
    except EpisodeFailed as failed:
        state.fail(failed.failure)
    except TimeoutError:
        state.fail(Failure("episode_timeout", f"episode exceeded {ctx.config.episode_timeout}s"))
    except TemplateError as exc:
        state.fail(Failure("template_error", str(exc)))
    # anything else is a bug in rollforge: it propagates (boundary.is_own_bug)
    finally:
        gate.leave()
        if session is not None:
            await finish_and_close(state, session, ctx)
    return state.trajectory(session)


async def _turns(state: EpisodeState, session: Any, ctx: EpisodeContext, gate: Gate) -> None:
    config, renderer, tokens = ctx.config, ctx.renderer, state.tokens
    reset = await env_call(state, session.reset(state.sample), "reset", config)
    stop = reset.stop if reset.stop is not None else state.sample.stop
    prompt, state.tools = renderer.with_tool_prompt(reset.prompt, reset.tools, ctx.parser)
    state.messages += prompt
    check_images(prompt, ctx)  # after keeping them: a failed trajectory still shows the images
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
        completion = await generate(state, ctx, _params(config, budget, stop, renderer, state.index, turn))
        generated = list(completion.token_ids)
        tokens.extend(generated, completion.logprobs, completion.version)
        text = renderer.decode(renderer.content_ids(generated))
        calls = _with_ids(await ctx.parse(text), renderer, state.index, turn)
        state.messages.append(Message("assistant", text, tool_calls=calls))

        await gate.wait("step")
        step = await env_call(state, session.step(tuple(state.messages)), "step", config)
        ending = _ending(step.ending, completion.finish_reason)
        state.rewards.append(float(step.reward))
        state.failures += step.failures
        covered = len(state.messages)
        state.messages += step.messages
        check_images(step.messages, ctx)
        observation = await _observation(state, step.messages, ending, covered, generated, incremental, ctx)
        if observation is None:  # the episode ended, or went on in a new segment
            if state.ending:
                return
        elif _append(state, observation, covered, ending, ctx):
            return
        pending = renderer.generation_prompt if incremental else []
        if step.stop is not None:
            stop = step.stop
    state.ending = "max_turns_reached"


def _ending(ended: Ending | None, finish_reason: str | None) -> Ending | None:
    """How a step ends the episode (``ended``, None: it goes on), read with how its reply ended: a
    reply cut at its token budget cannot have reached the task's end (see the module docstring)."""
    return "truncated" if ended == "terminated" and finish_reason == "length" else ended


async def _observation(
    state: EpisodeState,
    messages: tuple[Message, ...],
    ending: Ending | None,
    covered: int,
    generated: list[int],
    incremental: bool,
    ctx: EpisodeContext,
) -> list[int] | None:
    """The ids to append after a turn (``messages``, the step's; ``ending``, how it ends the
    episode); None when there are none to append because the episode ended (``state.ending`` set)
    or the conversation went on in a new segment."""
    renderer, tokens = ctx.renderer, state.tokens
    if ending and not messages:
        return []  # the episode ends on the policy's own tokens
    if incremental:
        return renderer.closing_ids(generated) + await ctx.delta_ids(messages, state.tools)
    # the whole conversation, rendered as the template does: appended, or a new segment
    whole = renderer.conversation_ids(state.messages, state.tools, add_generation_prompt=not ending)
    if whole[: len(tokens.ids)] == tokens.ids:
        return whole[len(tokens.ids) :]
    if ending:  # no segment to start: the last one renders the messages before
        state.last_covers, state.ending = covered, ending
    elif len(whole) >= ctx.config.max_seq_len:
        del state.messages[covered:]  # nothing of them is in the ids
        state.ending = "truncated"
    else:
        tokens.close(state.messages[:covered])
        tokens.begin(whole)
    return None


def _append(
    state: EpisodeState, observation: list[int], covered: int, ended: Ending | None, ctx: EpisodeContext
) -> bool:
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


def _keep_what_fits(state: EpisodeState, covered: int, kept: list[int], renderer: ChatRenderer) -> None:
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
