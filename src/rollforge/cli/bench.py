"""``rollforge bench NAME``: benchmarks that print one JSON object each.

Each benchmark is a module under ``rollforge.bench`` with ``add_arguments(parser)`` and
``main(args) -> dict``; register it in ``BENCHMARKS`` (name -> module, help). Modules keep their
heavy imports inside functions, so building the parser stays cheap.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

BENCHMARKS: dict[str, tuple[str, str]] = {
    "vs-trl": (
        "vs_trl",
        "seconds per GRPO step vs TRL GRPOTrainer (SmolLM2 arithmetic; or a tool-calling game), where the time goes",
    ),
    "learning": (
        "learning",
        "held-out reward per step and per wall second vs TRL GRPOTrainer (SmolLM2 on calculator, same warm-up)",
    ),
    "overhead": ("overhead", "engine wall time vs the critical-path bound (scripted backend)"),
    "hf-throughput": ("hf_throughput", "rollout tokens/s on the HF backend vs raw model.generate"),
    "vllm-throughput": ("vllm_throughput", "multi-turn rollout tokens/s on the vLLM backend vs vLLM's LLM.generate"),
    "env-throughput": ("env_throughput", "OpenEnv client steps/s at 1/16/64 sessions vs a bare WebSocket loop"),
    "async-vs-lockstep": (
        "async_vs_lockstep",
        "async vs lockstep wall time under heavy-tailed tool latency, vs the critical path",
    ),
    "long-horizon": ("long_horizon", "fraction of wall time spent rendering 128-turn episodes, vs full re-rendering"),
    "fuzz": ("fuzz", "malformed tool calls in every family's format through the engine: failures counted, none fatal"),
    "gateway": (
        "gateway",
        "agents through the OpenAI SDK and the gateway vs the same requests sent to the backend directly",
    ),
    "train-throughput": (
        "train_throughput",
        "training tokens/s, step time and MFU of real policy updates on random tokens",
    ),
    "async-training": (
        "async_training",
        "wall time of GRPO at max_staleness 0/1/2 with remote-like generation, vs max(generation, update) per step",
    ),
    "gpu": (
        "gpu",
        "every GPU path on random-initialised real architectures: GRPO vs TRL, FSDP2 checkpoint, MFU (one JSON report)",
    ),
    "scale": ("scale", "10,000 concurrent episodes on one machine: peak memory per episode, wall vs the lower bound"),
    "soak": (
        "soak",
        "100,000 episodes with injected faults through one engine: memory, threads, fds, every trajectory written",
    ),
}


def add_parser(commands: Any) -> None:
    p = commands.add_parser("bench", help="run a benchmark and print its JSON result")
    names = p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module_name, help_text) in BENCHMARKS.items():
        module = importlib.import_module(f"rollforge.bench.{module_name}")
        sub = names.add_parser(name, help=help_text)
        module.add_arguments(sub)
        sub.set_defaults(run=lambda args, module=module: _print(module.main(args)))


def _print(result: dict[str, Any]) -> int:
    print(json.dumps(result, indent=2))
    return 0
