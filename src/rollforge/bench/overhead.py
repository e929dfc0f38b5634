"""Engine overhead: wall time of many multi-turn episodes against the critical-path lower bound.

Every episode is a real tool-calling conversation: the scripted backend (fixed, known latency per
request) writes a Hermes tool call each turn, the engine parses and validates it, an
environment class in the TRL style runs the tool, and the result is rendered through the real chat
template of a real tokenizer. With all episodes in flight at once and no other cost, no scheduler
can finish before ``turns x latency`` (each turn of an episode waits for its own generation); the
ratio of the measured wall time to that bound is the engine's overhead.

The headline ratio uses an ``async def`` tool, which runs on the event loop. The same run with a
plain ``def`` tool (run in worker threads, rollforge's default for sync code so that a hung tool
cannot stall other episodes) is reported beside it: each trip to a worker thread costs time on the
loop, and that cost is the environment's, not the scheduler's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ..backends.scripted import ScriptedBackend
from ..chat.render import ChatRenderer
from ..envs.factory import FactoryEnvironment
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..testing import tokenizer_or_tiny
from ..types import Sample


class Notebook:
    """Keeps notes (a sync tool)."""

    def reset(self, **row: Any) -> str:
        self.notes: list[str] = []
        return "Write notes."

    def note(self, text: str) -> str:
        """Write one note.

        Args:
            text: The note.
        """
        self.notes.append(text)
        return f"noted ({len(self.notes)})"


class AsyncNotebook(Notebook):
    """Keeps notes (an async tool)."""

    async def note(self, text: str) -> str:
        """Write one note.

        Args:
            text: The note.
        """
        self.notes.append(text)
        return f"noted ({len(self.notes)})"


def scripted_reply(request) -> str:
    turn = request.call * 7 % 8  # a few distinct notes
    return f'<tool_call>\n{{"name": "note", "arguments": {{"text": "note {turn}"}}}}\n</tool_call>'


def run(
    episodes: int = 1024,
    turns: int = 8,
    latency: float = 1.0,
    mode: str = "async",
    tokenizer_dir: str | None = None,
) -> dict[str, Any]:
    renderer = ChatRenderer(tokenizer_or_tiny(tokenizer_dir))
    headline = _measure(AsyncNotebook, renderer, episodes, turns, latency, mode)
    threads = _measure(Notebook, renderer, episodes, turns, latency, mode)
    return {
        "benchmark": "overhead",
        "mode": mode,
        "episodes": episodes,
        "turns_per_episode": turns,
        "backend_latency_s": latency,
        "lower_bound_seconds": turns * latency,
        **headline,
        "sync_tools_in_threads": threads,
    }


def _measure(
    environment: type, renderer: ChatRenderer, episodes: int, turns: int, latency: float, mode: str
) -> dict[str, Any]:
    backend = ScriptedBackend(scripted_reply, renderer, end_token_id=renderer.stop_token_ids[0], latency=latency)
    samples = [
        Sample(prompt=[{"role": "user", "content": f"Episode {i}."}], task_name="notes") for i in range(episodes)
    ]
    config = RolloutConfig(mode=mode, max_turns=turns, concurrency=episodes, max_seq_len=8192, max_new_tokens=64)
    started = time.perf_counter()
    result = asyncio.run(arollout(samples, {"notes": FactoryEnvironment(environment)}, backend, renderer, config))
    wall = time.perf_counter() - started
    bound = turns * latency
    done_turns = sum(t.turns for t in result.trajectories)
    return {
        "wall_seconds": round(wall, 3),
        "ratio_to_lower_bound": round(wall / bound, 4),
        "engine_ms_per_turn": round(1000 * (wall - bound) / max(done_turns, 1), 4),
        "turns_completed": done_turns,
        "tool_failures": result.metrics["failures"],
        "errors": result.metrics["errors"],
    }


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run(), indent=2))


def add_arguments(parser: Any) -> None:
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per backend request")
    parser.add_argument("--mode", choices=["async", "lockstep"], default="async")


def main(args: Any) -> dict[str, Any]:
    return run(args.episodes, args.turns, args.latency, args.mode)
