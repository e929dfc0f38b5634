"""``rollforge bench NAME``: benchmarks that print one JSON object each."""

from __future__ import annotations

import json
from typing import Any


def add_parser(commands: Any) -> None:
    p = commands.add_parser("bench", help="run a benchmark and print its JSON result")
    names = p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")

    overhead = names.add_parser("overhead", help="engine wall time vs the critical-path bound (scripted backend)")
    overhead.add_argument("--episodes", type=int, default=1024)
    overhead.add_argument("--turns", type=int, default=8)
    overhead.add_argument("--latency", type=float, default=1.0, help="seconds per backend request")
    overhead.add_argument("--mode", choices=["async", "lockstep"], default="async")
    overhead.set_defaults(run=_overhead)

    hf = names.add_parser("hf-throughput", help="rollout tokens/s on the HF backend vs raw model.generate")
    hf.add_argument("--model", default="smollm2-135m")
    hf.add_argument("--episodes", type=int, default=16)
    hf.add_argument("--max-new-tokens", type=int, default=64)
    hf.add_argument("--repeats", type=int, default=2, help="alternating measurements of each side")
    hf.set_defaults(run=_hf_throughput)


def _overhead(args: Any) -> int:
    from ..bench.overhead import run

    print(json.dumps(run(args.episodes, args.turns, args.latency, args.mode), indent=2))
    return 0


def _hf_throughput(args: Any) -> int:
    from ..bench.hf_throughput import run

    print(json.dumps(run(args.model, args.episodes, args.max_new_tokens, args.repeats), indent=2))
    return 0
