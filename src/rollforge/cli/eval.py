"""``rollforge eval``: roll a model or checkpoint out greedily (or ``--samples N`` times per prompt)
on the backend ``--backend`` names (as ``rollforge rollout``: ``hf``, ``vllm``, or ``openai`` with
``--base-url``) and print mean reward and pass@k as JSON (``inputs/evaluate.py``). The ``--env``
environments and their prompts are read as every run reads them (``inputs/read.py``), episodes
split evenly over the environments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    ev = commands.add_parser("eval", help="evaluate a model or checkpoint: mean reward and pass@k")
    ev.add_argument("--model", default="smollm2-135m", help="model directory, checkpoint model/ directory or alias")
    ev.add_argument("--env", action="append", dest="envs", metavar="NAME", help="bundled environment (repeatable)")
    ev.add_argument("--episodes", type=int, default=64, help="prompts (spread over the environments)")
    ev.add_argument("--samples", type=int, default=1, help="samples per prompt (1: greedy)")
    ev.add_argument("--max-turns", type=int, default=4)
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument("--success-threshold", type=float, default=1.0, help="total reward counted as a pass")
    ev.add_argument("--seed", type=int, default=1234)
    ev.add_argument(
        "--backend",
        choices=["hf", "vllm", "openai"],
        default="hf",
        help="hf: transformers in this process; vllm: vLLM in this process; openai: a served model",
    )
    ev.add_argument("--base-url", default=None, help="server of the openai backend, e.g. http://127.0.0.1:8000")
    ev.add_argument("--served-model-name", default=None, help="model name on the openai backend's server")
    ev.add_argument(
        "--out", type=Path, default=None, help="write metrics.json (this result) and trajectories.jsonl here"
    )
    ev.set_defaults(run=_eval)


def _eval(args: Any) -> int:
    from ..backends.config import BackendConfig
    from ..chat.render import ChatRenderer
    from ..cli.rollout import check_out_dir, write_results
    from ..envs.library import get_env_spec
    from ..errors import ConfigError
    from ..inputs.config import EnvConfig
    from ..inputs.data import even_counts
    from ..inputs.evaluate import evaluate
    from ..inputs.read import Prompts, read_inputs
    from ..models import load_tokenizer
    from ..rollout.config import RolloutConfig
    from ..workers import run_sync

    for flag, value in (("--episodes", args.episodes), ("--samples", args.samples)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.out is not None:
        check_out_dir(args.out, "--out")
    names = args.envs or ["arithmetic"]
    for name in names:  # bundled environments only: their generators give the prompts
        get_env_spec(name)
    prompts = Prompts(generated=args.episodes, seed=args.seed, counts=even_counts, env_flag="--env")
    task_to_env, samples = read_inputs([EnvConfig(name=name) for name in names], prompts)
    config = RolloutConfig.build(
        max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, greedy=args.samples == 1, seed=args.seed
    )
    backend_config = BackendConfig(
        kind=args.backend,
        model=args.model,
        base_url=args.base_url,
        served_model_name=args.served_model_name,
        seed=args.seed,
        check_reachable=True,
    )
    renderer = ChatRenderer(load_tokenizer(args.model))
    result = run_sync(
        evaluate(
            backend_config,
            samples,
            task_to_env,
            renderer,
            config,
            samples_per_prompt=args.samples,
            success_threshold=args.success_threshold,
        )
    )
    print(json.dumps(result.to_json(), indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_results(args.out, result.trajectories, result.to_json())
    return 0
