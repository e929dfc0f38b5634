"""Async vs lockstep scheduling when tool latency is heavy-tailed (``rollforge bench async-vs-lockstep``).

The same episodes run twice, once per ``RolloutConfig.mode``, with every episode in flight at once
(concurrency = episodes). Each is an agent that writes code and runs it: every turn the scripted
backend writes a Hermes call ``run(code)`` with 1..``--max-lines`` lines of Python, rendered through
the real chat template of the tiny test tokenizer, and the tool sleeps, then prints a few lines.

Defaults (a code-execution agent): a reply is 1-12 lines of code (48-344 tokens of the tiny
tokenizer, which needs ~2.5 tokens where a production tokenizer needs one) and costs 50 ms per
request plus 4 ms per token, i.e. ~10 ms per real token: a batched decoder serving hundreds of
sequences gives each ~100 tokens/s. The tool's run time is log-normal with median 0.2 s and sigma 1.0: mean
0.33 s, p99 2 s, and in 2,048 runs a few of 5 s or more (imports, slow tests), like sandboxed code
execution. Reply lengths come from the request's sampling seed, which derives from (config seed,
episode, turn), and tool times from (episode seed, turn), so both modes see identical costs per
(episode, turn); ``same_trajectories`` checks that both produced the same tokens.

Bounds, from the costs actually incurred (generated tokens of each turn, sleeps the tool recorded):
episode e is a chain gen, tool, gen, tool, ... so no scheduler finishes before
``critical_path = max_e sum_t (gen_et + tool_et)`` (with unlimited concurrency a perfect async
scheduler reaches it). A barrier schedule waits every turn for the slowest generation and then the
slowest tool: ``lockstep_bound = sum_t (max_e gen_et + max_e tool_et)``. Targets: async wall
<= 0.5 x lockstep wall, and <= 1.1 x the critical path.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any

from ..backends.scripted import ScriptedBackend
from ..chat.render import ChatRenderer
from ..envs.factory import FactoryEnvironment
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..seeds import mix
from ..testing import tokenizer_or_tiny
from ..types import Sample, Trajectory

CODE_LINES = (
    "import json, math",
    "data = [3, 1, 4, 1, 5, 9, 2, 6]",
    "def mean(values):",
    "    return sum(values) / len(values)",
    "result = sorted(data, key=lambda x: -x)",
    "for i in range(10):",
    "    print(i * i, mean(data[: i + 1]))",
    "assert mean([2, 4]) == 3, 'mean is wrong'",
    "print(json.dumps({'answer': 42, 'ok': True}))",
    "total = sum(x * x for x in data if x % 2 == 0)",
    "print(math.sqrt(total))",
    "with open('notes.txt', 'w') as f: f.write(str(result))",
)
OUTPUT_LINES = (
    "0 3.0",
    "1 2.0",
    "4 2.6666666666666665",
    "[9, 6, 5, 4, 3, 2, 1, 1]",
    '{"answer": 42, "ok": true}',
    "8.48528137423857",
    "Traceback (most recent call last):",
    "AssertionError: mean is wrong",
    "ok",
)


def tool_seconds(seed: int, turn: int, median: float, sigma: float) -> float:
    """The tool's run time for (episode seed, turn): log-normal with this median and sigma."""
    return median * math.exp(sigma * random.Random(f"{seed}:{turn}").gauss(0.0, 1.0))


class CodeRunner:
    """Runs code (simulated): sleeps a log-normal time drawn from (episode seed, turn), then prints
    1..``max_output_lines`` lines."""

    def __init__(self, median: float, sigma: float, max_output_lines: int = 6):
        self.median, self.sigma, self.max_output_lines = median, sigma, max_output_lines
        self.delays: list[float] = []

    def reset(self, seed: int) -> str:
        self.seed = seed
        return "Write Python and run it with the tool."

    async def run(self, code: str) -> str:
        """Run Python code and show its output.

        Args:
            code: The program.
        """
        rng = random.Random(mix(self.seed, len(self.delays)))
        delay = tool_seconds(self.seed, len(self.delays), self.median, self.sigma)
        self.delays.append(delay)
        if delay > 0:
            await asyncio.sleep(delay)
        lines = rng.choices(OUTPUT_LINES, k=rng.randint(1, self.max_output_lines))
        return "exit status 0\nstdout:\n" + "\n".join(lines)


def code_script(max_lines: int):
    """Replies with a ``run`` call of 1..max_lines lines chosen by the request's sampling seed, which
    derives from (config seed, episode, turn)."""

    def reply(request) -> str:
        rng = random.Random(request.params.seed)
        lines = rng.choices(CODE_LINES, k=rng.randint(1, max_lines))
        call = {"name": "run", "arguments": {"code": "\n".join(lines)}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return reply


def generation_costs(trajectory: Trajectory, latency: float, per_token_latency: float) -> list[float]:
    """Seconds the scripted backend slept for each turn: one run of policy tokens per turn."""
    runs, previous = [], 0
    for flag in trajectory.loss_mask:
        if flag and not previous:
            runs.append(0)
        if flag:
            runs[-1] += 1
        previous = flag
    return [latency + per_token_latency * n for n in runs]


def bounds(trajectories, latency: float, per_token_latency: float) -> tuple[float, float]:
    """(critical path of any scheduler, what a per-turn barrier schedule must take)."""
    gens = [generation_costs(t, latency, per_token_latency) for t in trajectories]
    tools = [t.environment.delays for t in trajectories]
    critical = max(sum(g) + sum(x) for g, x in zip(gens, tools))
    turns = max(len(g) for g in gens)
    barrier = sum(
        max((g[k] for g in gens if k < len(g)), default=0.0) + max((x[k] for x in tools if k < len(x)), default=0.0)
        for k in range(turns)
    )
    return critical, barrier


def _once(
    mode: str,
    renderer: ChatRenderer,
    episodes: int,
    turns: int,
    median: float,
    sigma: float,
    latency: float,
    per_token_latency: float,
    max_lines: int,
) -> tuple[float, Any]:
    backend = ScriptedBackend(
        code_script(max_lines),
        renderer,
        end_token_id=renderer.stop_token_ids[0],
        latency=latency,
        per_token_latency=per_token_latency,
    )
    samples = [
        Sample(prompt=[{"role": "user", "content": f"Task {i}: analyse the data."}], task_name="code", row={"seed": i})
        for i in range(episodes)
    ]
    env = FactoryEnvironment(lambda: CodeRunner(median, sigma))
    config = RolloutConfig(
        mode=mode, max_turns=turns, concurrency=episodes, max_seq_len=32768, max_new_tokens=1024, step_timeout=None
    )
    started = time.perf_counter()
    result = asyncio.run(arollout(samples, {"code": env}, backend, renderer, config))
    return time.perf_counter() - started, result


def run(
    episodes: int = 256,
    turns: int = 8,
    median: float = 0.2,
    sigma: float = 1.0,
    latency: float = 0.05,
    per_token_latency: float = 0.004,
    max_lines: int = 12,
    tokenizer_dir: str | None = None,
) -> dict[str, Any]:
    renderer = ChatRenderer(tokenizer_or_tiny(tokenizer_dir))
    walls, results = {}, {}
    for mode in ("async", "lockstep"):
        walls[mode], results[mode] = _once(
            mode, renderer, episodes, turns, median, sigma, latency, per_token_latency, max_lines
        )
    critical, barrier = bounds(results["async"].trajectories, latency, per_token_latency)
    pairs = zip(results["async"].trajectories, results["lockstep"].trajectories)
    sleeps = [d for t in results["async"].trajectories for d in t.environment.delays]
    return {
        "benchmark": "async-vs-lockstep",
        "episodes": episodes,
        "turns_per_episode": turns,
        "tool_latency": {
            "distribution": "lognormal",
            "median_s": median,
            "sigma": sigma,
            "mean_s": round(sum(sleeps) / max(len(sleeps), 1), 4),
            "max_s": round(max(sleeps, default=0.0), 4),
        },
        "generation": {
            "latency_s": latency,
            "per_token_latency_s": per_token_latency,
            "max_lines": max_lines,
            "mean_tokens_per_turn": round(results["async"].metrics["mean_gen_tokens_per_sample"] / turns, 1),
        },
        "ratio_async_to_lockstep": round(walls["async"] / walls["lockstep"], 4),
        "async_wall_seconds": round(walls["async"], 3),
        "lockstep_wall_seconds": round(walls["lockstep"], 3),
        "critical_path_seconds": round(critical, 3),
        "async_to_critical_path": round(walls["async"] / critical, 4),
        "lockstep_bound_seconds": round(barrier, 3),
        "lockstep_to_bound": round(walls["lockstep"] / barrier, 4),
        "turns_completed": {m: r.metrics["total_turns"] for m, r in results.items()},
        "same_trajectories": all(a.token_ids == b.token_ids for a, b in pairs),
        "errors": {m: r.metrics["errors"] for m, r in results.items()},
        "tool_failures": {m: r.metrics["failures"] for m, r in results.items()},
    }


def add_arguments(parser: Any) -> None:
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tool-median", type=float, default=0.2, help="median tool run time (s)")
    parser.add_argument("--tool-sigma", type=float, default=1.0, help="sigma of log(tool run time)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per backend request")
    parser.add_argument("--per-token-latency", type=float, default=0.004, help="seconds per generated token")
    parser.add_argument("--max-lines", type=int, default=12, help="lines of code per reply: 1..N")


def main(args: Any) -> dict[str, Any]:
    return run(
        args.episodes,
        args.turns,
        args.tool_median,
        args.tool_sigma,
        args.latency,
        args.per_token_latency,
        args.max_lines,
    )
