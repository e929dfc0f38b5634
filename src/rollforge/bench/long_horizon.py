"""Rendering cost of long episodes (``rollforge bench long-horizon``).

32 episodes of 128 tool-calling turns each (``CodeRunner`` from ``async_vs_lockstep``: a ``run``
call of 1-12 lines of code per turn, a result of 1-48 output lines, ~520 characters on average),
through the real chat template and tokenizer of SmolLM2-135M-Instruct (``--tokenizer``; the tests
use the tiny test tokenizer), with ``max_seq_len`` large enough that nothing is cut
(``turns_completed`` and ``every_episode_reached_max_turns`` check it). Generation costs 50 ms per
request plus 10 ms per token (~100 tokens/s per sequence, a served 7B model's decode speed); the
tool returns at once.

What is measured: every ``ChatRenderer`` method the engine and the episode loop call
(``check_template``, ``with_tool_prompt``, ``prompt_ids``, ``content_ids``, ``decode``,
``closing_ids``, ``delta_ids``) is timed with ``perf_counter`` by a subclass defined here (outermost
calls only, so nested calls are not counted twice); a call is attributed to its episode's current
turn through the asyncio task it runs in (``content_ids`` comes first after each generation).
``render_fraction`` = the seconds those calls hold the event loop / rollout wall (target <= 0.015):
rendering on the loop delays every other episode, while the tokenizing of long observations, which
the episode hands to the render thread (the Rust tokenizer releases the GIL), runs beside it and is
reported as ``render_seconds_off_loop``. Rendering incrementally, a turn renders only its new
messages, so ``render_ms_per_turn`` (on the loop) of the first and the last 16 turns should match
however long the conversation is. With a much faster backend (``--latency 0.02
--per-token-latency 0``) the rollout is CPU-bound and the fraction approaches the share of
rendering in the engine's own CPU time per turn. For comparison, ``full_rerender_seconds_per_episode``
is what re-rendering the whole conversation with ``apply_chat_template`` and tokenizing it after every
turn costs, measured on one finished episode (quadratic in its length); ``full_rerender_matches``
checks that its final ids equal the trajectory's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict
from typing import Any, Sequence

from ..backends.scripted import ScriptedBackend
from ..chat.render import ChatRenderer
from ..envs.factory import FactoryEnvironment
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..testing import make_tokenizer
from ..types import Sample, Trajectory
from .async_vs_lockstep import CodeRunner, bounds, code_script

TIMED = ("check_template", "with_tool_prompt", "prompt_ids", "content_ids", "decode", "closing_ids", "delta_ids")


class TimedRenderer(ChatRenderer):
    """A ``ChatRenderer`` that adds the time of each outermost call on the event loop to
    ``per_turn[turn]`` (turn 0: the prompt and the start-up check), and of each call on another
    thread (long observations are tokenized on the render thread) to ``off_loop``."""

    def __init__(self, tokenizer: Any):
        super().__init__(tokenizer)
        self.per_turn: defaultdict[int, float] = defaultdict(float)
        self.off_loop = 0.0
        self._turn: dict[Any, int] = {}  # asyncio task (one per episode) -> its turn
        self._local = threading.local()  # nesting depth, per thread
        self._loop_thread = threading.get_ident()


def _timed(name: str):
    method = getattr(ChatRenderer, name)

    def timed(self: TimedRenderer, *args: Any, **kwargs: Any) -> Any:
        depth = getattr(self._local, "depth", 0)
        if depth:
            return method(self, *args, **kwargs)
        self._local.depth = 1
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            self._local.depth = 0
            if threading.get_ident() != self._loop_thread:
                self.off_loop += elapsed
            else:
                task = asyncio.current_task()
                if name == "content_ids":
                    self._turn[task] = self._turn.get(task, 0) + 1
                self.per_turn[self._turn.get(task, 0)] += elapsed

    timed.__name__ = name
    return timed


for _name in TIMED:
    setattr(TimedRenderer, _name, _timed(_name))


def full_rerender_seconds(trajectory: Trajectory, tokenizer: Any) -> tuple[float, bool]:
    """Seconds to render the whole conversation with the chat template and tokenize it after every
    turn, and whether the final rendering's ids equal the trajectory's."""
    chat = [m.to_chat() for m in trajectory.messages]
    ends = [i + 2 for i, m in enumerate(trajectory.messages) if m.role == "assistant"]  # + its tool result
    fast, tools = tokenizer.backend_tokenizer, list(trajectory.tools) or None
    total, ids = 0.0, []
    for end in ends:
        started = time.perf_counter()
        text = tokenizer.apply_chat_template(
            chat[:end], tools=tools, tokenize=False, add_generation_prompt=end < len(chat)
        )
        ids = fast.encode(text, add_special_tokens=False).ids
        total += time.perf_counter() - started
    return total, tuple(ids) == trajectory.token_ids


def run(
    episodes: int = 32,
    turns: int = 128,
    latency: float = 0.05,
    per_token_latency: float = 0.01,
    max_output_lines: int = 48,
    tokenizer_dir: str | None = None,
) -> dict[str, Any]:
    """``tokenizer_dir``: a model directory or alias whose tokenizer and template to use (None: the
    tiny test model's)."""
    tokenizer = _tokenizer(tokenizer_dir)
    renderer = TimedRenderer(tokenizer)
    backend = ScriptedBackend(
        code_script(12),
        tokenizer,
        end_token_id=renderer.stop_token_ids[0],
        latency=latency,
        per_token_latency=per_token_latency,
    )
    samples = [
        Sample(prompt=[{"role": "user", "content": f"Task {i}: analyse the data."}], task_name="code", row={"seed": i})
        for i in range(episodes)
    ]
    env = FactoryEnvironment(lambda: CodeRunner(0.0, 0.0, max_output_lines))
    config = RolloutConfig(max_turns=turns, concurrency=episodes, max_seq_len=1 << 22, max_new_tokens=1024)
    started = time.perf_counter()
    result = asyncio.run(arollout(samples, {"code": env}, backend, renderer, config))
    wall = time.perf_counter() - started
    trajectories = result.trajectories
    longest = max(trajectories, key=lambda t: len(t.token_ids))
    rerender, matches = full_rerender_seconds(longest, tokenizer)
    return {
        "benchmark": "long-horizon",
        "episodes": episodes,
        "max_turns": turns,
        "backend_latency_s": latency,
        "per_token_latency_s": per_token_latency,
        "tokenizer": getattr(tokenizer, "name_or_path", None) or "tiny test model",
        "turns_completed": result.metrics["total_turns"],
        "every_episode_reached_max_turns": all(t.turns == turns and t.max_turns_reached for t in trajectories),
        "mean_tokens_per_episode": round(result.metrics["mean_total_tokens_per_sample"]),
        "wall_seconds": round(wall, 3),
        "lower_bound_seconds": round(bounds(trajectories, latency, per_token_latency)[0], 3),
        **render_figures(renderer, trajectories, turns, wall),
        "full_rerender_seconds_per_episode": round(rerender, 4),
        "full_rerender_tokens": len(longest.token_ids),
        "full_rerender_matches": matches,
        "errors": result.metrics["errors"],
        "tool_failures": result.metrics["failures"],
    }


def _tokenizer(tokenizer_dir: str | None) -> Any:
    """The tokenizer of ``tokenizer_dir`` (a model directory or alias), or the tiny test model's."""
    if tokenizer_dir is None:
        return make_tokenizer()
    from ..models import load_tokenizer

    return load_tokenizer(tokenizer_dir)


def render_figures(
    renderer: TimedRenderer, trajectories: Sequence[Trajectory], turns: int, wall: float
) -> dict[str, Any]:
    """What rendering cost on the event loop (in total, as a share of the rollout's ``wall`` seconds,
    per turn over the first and the last eighth of the ``turns``, per episode) and off it."""
    render = sum(renderer.per_turn.values())
    window = max(turns // 8, 1)

    def ms_per_turn(first: int, last: int) -> float:
        done = sum(min(t.turns, last) - first + 1 for t in trajectories if t.turns >= first)
        return round(1000 * sum(renderer.per_turn[k] for k in range(first, last + 1)) / max(done, 1), 4)

    return {
        "render_seconds": round(render, 4),
        "render_fraction": round(render / wall, 5),
        "render_seconds_off_loop": round(renderer.off_loop, 4),
        f"render_ms_per_turn_turns_1_{window}": ms_per_turn(1, window),
        f"render_ms_per_turn_turns_{turns - window + 1}_{turns}": ms_per_turn(turns - window + 1, turns),
        "render_seconds_per_episode": round(render / len(trajectories), 4),
    }


def add_arguments(parser: Any) -> None:
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=128)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per backend request")
    parser.add_argument("--per-token-latency", type=float, default=0.01, help="seconds per generated token")
    parser.add_argument(
        "--tokenizer",
        default="smollm2-135m",
        help="model directory or alias whose tokenizer and chat template render the turns",
    )
    parser.add_argument("--max-output-lines", type=int, default=48, help="tool result lines per turn: 1..N")


def main(args: Any) -> dict[str, Any]:
    return run(args.episodes, args.turns, args.latency, args.per_token_latency, args.max_output_lines, args.tokenizer)
