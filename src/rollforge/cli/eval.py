"""``rollforge eval``: roll a model or checkpoint out greedily (or ``--samples N`` times per prompt)
on the backend ``--backend`` names (as ``rollforge rollout``: ``hf``, ``vllm``, or ``openai`` with
``--base-url``) and print mean reward and pass@k as JSON (``inputs/evaluate.py``).

It reads what ``rollforge rollout`` reads, with the same flags (``rollout_flags.py``): ``--env``
names any environment training takes (bundled, an OpenEnv URL, ``file.py:Class``), ``--data`` a
prompts file (every row by default; needed by environments without a generator), and ``--reward
file.py:function`` (repeatable) adds TRL-style reward functions to the environments' rewards.
Without ``--data``, ``--episodes`` prompts (64 by default) come from the environments' generators,
split evenly. An evaluation that nothing would score (no reward function, environment classes
without ``get_reward()``) is refused before the model loads. ``--out`` writes ``metrics.json``
(this result) and ``trajectories.jsonl``, refused when it holds a rollout unless ``--overwrite``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .rollout_flags import add_backend_flags, add_input_flags

#: Prompts drawn from the generators when ``--episodes`` is not given.
DEFAULT_EPISODES = 64


def add_parser(commands: Any) -> None:
    ev = commands.add_parser("eval", help="evaluate a model or checkpoint: mean reward and pass@k")
    add_input_flags(ev, f"prompts (default {DEFAULT_EPISODES}, spread over the environments; with --data, every row)")
    ev.add_argument("--samples", type=int, default=1, help="samples per prompt (1: greedy)")
    ev.add_argument("--max-turns", type=int, default=4)
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument("--success-threshold", type=float, default=1.0, help="reward counted as a pass")
    ev.add_argument("--seed", type=int, default=1234)
    add_backend_flags(ev)
    ev.add_argument(
        "--out", type=Path, default=None, help="write metrics.json (this result) and trajectories.jsonl here"
    )
    ev.add_argument("--overwrite", action="store_true", help="delete the rollout that --out holds, then start over")
    ev.set_defaults(run=_eval)


def _eval(args: Any) -> int:
    from ..errors import ConfigError
    from ..inputs.evaluate import Scoring, evaluate
    from ..inputs.rewards import unscored
    from ..rollout.config import RolloutConfig
    from ..workers import run_sync
    from .rollout import environments_and_prompts
    from .rollout_flags import DEFAULT_MAX_SEQ_LEN, REWARD_FLAG, backend_config, open_renderer, reward_functions
    from .rollout_results import check_out_dir, claim_out, write_results

    for flag, value in (("--episodes", args.episodes), ("--samples", args.samples)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.out is not None:
        check_out_dir(args.out, "--out")
    names = args.envs or ["arithmetic"]
    samples, task_to_env = environments_and_prompts(names, args.data, args.episodes, args.seed, DEFAULT_EPISODES)
    functions = reward_functions(args.rewards)
    no_reward = unscored(task_to_env, (s.task_name for s in samples), functions, REWARD_FLAG)
    if no_reward is not None:
        raise ConfigError(f"nothing would score the evaluation: {no_reward}")
    config = RolloutConfig.build(
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_seq_len=DEFAULT_MAX_SEQ_LEN if args.max_seq_len is None else args.max_seq_len,
        greedy=args.samples == 1,
        seed=args.seed,
    )
    renderer, config = open_renderer(args, config, samples, task_to_env)
    if args.out is not None:
        claim_out(args.out, args.overwrite)
    generation = backend_config(args)
    result = run_sync(
        evaluate(
            generation,
            samples,
            task_to_env,
            renderer,
            config,
            scoring=Scoring(args.samples, args.success_threshold, tuple(functions)),
        )
    )
    print(json.dumps(result.to_json(), indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_results(args.out, result.trajectories, result.to_json(), result.rewards if functions else None)
    return 0
