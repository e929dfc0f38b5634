"""``rollforge rollout``: roll a model out on environments and write the results.

``--env`` takes what a training config's ``environments`` take: a bundled name, an OpenEnv server
URL, ``module:attribute`` or ``file.py:Class``; ``--env`` and ``--data`` are read by the function
training reads its inputs with (``inputs/read.py``), a name given twice refused as there; nothing
here enters ``train/``. Prompts come from the bundled environments' generators, episodes split
evenly over the ``--env`` environments (the first ones get the remainder) and interleaved, so every
environment runs from the start; or from ``--data FILE`` (rows as in training: ``prompt``, optional
``task_name``/``environment``), whose first ``--episodes`` rows are used (cycling through the file;
all rows by default). ``--reward file.py:function`` (repeatable) adds TRL-style reward functions to
the environments' rewards, applied by training's own code; when nothing scores the episodes (no
function, and environment classes without ``get_reward()``) the summary says so instead of
reporting zeros. ``--max-seq-len`` is fitted to the model's positions (``rollout_flags.py``).

The flags ``rollforge eval`` shares are ``rollout_flags.py``; where the results go (``--out``,
refused when it holds a rollout unless ``--overwrite``; ``trajectories.jsonl.partial`` streamed as
episodes end; ``trajectories.jsonl`` and ``metrics.json`` at the end) is ``rollout_results.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..types import Sample
from .rollout_flags import (
    DEFAULT_MAX_SEQ_LEN,
    REWARD_FLAG,
    add_backend_flags,
    add_input_flags,
    backend_config,
    open_renderer,
    reward_functions,
)
from .rollout_results import check_out_dir, claim_out, run_with_progress


def add_parser(commands: Any) -> None:
    p = commands.add_parser("rollout", help="run multi-turn rollouts of a model on environments")
    add_input_flags(p, "episodes (default 16; with --data, every row)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--overwrite", action="store_true", help="delete the rollout that --out holds, then start over")
    _add_sampling_flags(p)
    _add_limit_flags(p)
    add_backend_flags(p)
    _add_ray_flags(p)
    p.set_defaults(run=run)


def _add_sampling_flags(p: Any) -> None:
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--mode", choices=["async", "lockstep"], default="async")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--greedy", action="store_true", help="greedy decoding (overrides --temperature)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tool-parser", default=None, help="tool-call format (default: the model family's)")


def _add_limit_flags(p: Any) -> None:
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--engine-workers",
        type=int,
        default=1,
        help="engine processes the episodes are spread over (generation stays in this one unless the "
        "backend can be reopened in each)",
    )
    p.add_argument(
        "--step-timeout",
        type=float,
        default=None,
        help="seconds per environment call (default 60, or --episode-timeout when that is shorter)",
    )
    p.add_argument(
        "--episode-timeout",
        type=float,
        default=1800.0,
        help="seconds a whole episode may take (it then fails with episode_timeout)",
    )
    p.add_argument(
        "--infra-retries",
        type=int,
        default=0,
        help="times an episode that failed for infrastructure reasons (a dead environment actor, a "
        "backend error, a timeout) runs again from the start with the same seeds; never a policy failure",
    )


def _add_ray_flags(p: Any) -> None:
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where environments run: this process, or pools of Ray actors",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --executor ray: the cluster to join (auto, ray://host:10001); default a private local instance",
    )
    p.add_argument(
        "--env-actors", type=int, default=None, help="with --executor ray: Ray actors per environment (default 2)"
    )
    p.add_argument(
        "--env-actor-cpus",
        type=float,
        default=None,
        help="with --executor ray: CPUs reserved per actor (default: 1 on a joined cluster, a share of a private instance's CPUs)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="with --executor ray and --backend hf|vllm: generation replicas on Ray actors behind a sticky router (default 1)",
    )
    p.add_argument(
        "--replica-cpus",
        type=float,
        default=None,
        help="with --replicas: CPUs reserved per replica (default as for --env-actor-cpus)",
    )


def run(args: Any) -> int:
    from ..inputs.rewards import unscored

    _check_flags(args)
    config = _rollout_config(args)
    samples, task_to_env = environments_and_prompts(args.envs or ["arithmetic"], args.data, args.episodes, args.seed)
    functions = reward_functions(args.rewards)
    no_reward = unscored(task_to_env, (s.task_name for s in samples), functions, REWARD_FLAG)
    renderer, config = open_renderer(args, config, samples, task_to_env)  # checks made before the model loads
    claim_out(args.out, args.overwrite)
    generation = backend_config(
        args,
        concurrency=args.concurrency,
        replicas=1 if args.replicas is None else args.replicas,
        replica_cpus=args.replica_cpus,
    )
    ray_config = _ray_config(args)
    result = asyncio.run(
        _rollout(samples, task_to_env, generation, renderer, ray_config, config, args.out, functions, no_reward)
    )
    print(summary(result.metrics, args.out))
    return 0


def _check_flags(args: Any) -> None:
    """The flags alone, checked before anything is read."""
    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    check_out_dir(args.out, "--out")
    check_ray_flags(args, args.executor)
    if args.executor == "ray" and args.engine_workers != 1:
        raise ConfigError(
            f"--engine-workers {args.engine_workers} runs with --executor local only (Ray actors "
            "already take the environments out of this process)"
        )
    if args.tool_parser is not None:  # an unknown name fails now, not once the episodes run
        from ..chat.toolcalls import get_parser

        get_parser(args.tool_parser)


def _rollout_config(args: Any) -> Any:
    from ..rollout.config import RolloutConfig

    return RolloutConfig.build(
        mode=args.mode,
        max_turns=args.max_turns,
        max_seq_len=DEFAULT_MAX_SEQ_LEN if args.max_seq_len is None else args.max_seq_len,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        greedy=args.greedy,
        concurrency=args.concurrency,
        engine_workers=args.engine_workers,
        episode_timeout=args.episode_timeout,
        infra_retries=args.infra_retries,
        **({} if args.step_timeout is None else {"step_timeout": args.step_timeout}),
        seed=args.seed,
        tool_parser=args.tool_parser,
    )


def summary(m: dict[str, Any], out: Path) -> str:
    """The line a finished rollout prints."""
    episodes = f"{m['episodes']} episode{'' if m['episodes'] == 1 else 's'}"
    turns = f"{m['total_turns']} turn{'' if m['total_turns'] == 1 else 's'}"
    if m.get("no_reward"):  # said instead of a mean of zeros that no one gave
        reward = "no reward"
    elif m.get("mean_reward") is None:
        reward = "mean reward unknown (every episode ended in an infrastructure failure)"
    else:
        reward = f"mean reward {m['mean_reward']:.3f}"
    line = f"{episodes}, {turns}, {reward}, errors {m['errors'] or 'none'}, {m['wall_seconds']:.1f}s -> {out}"
    return f"{line}; nothing scored the episodes: {m['no_reward']}" if m.get("no_reward") else line


async def _rollout(samples, task_to_env, backend_config, renderer, ray_config, config, out: Path, functions, no_reward):
    """The whole rollout on one event loop: the backend (replicas first), then the environments."""
    from ..cluster.executor import placed
    from ..cluster.generation import open_generation

    async with open_generation(backend_config, tokenizer=renderer.tokenizer) as backend:
        with placed(task_to_env, ray_config) as where:
            return await run_with_progress(samples, where, backend, renderer, config, out, functions, no_reward)


def _ray_config(args: Any):
    """With ``--executor ray``: the Ray settings, connected (replicas start before the environments)."""
    if args.executor == "local":
        return None
    from ..cluster.config import RayConfig
    from ..cluster.executor import connect
    from ..rollout.config import describe_validation_error

    try:
        given = {"env_actors": args.env_actors} if args.env_actors is not None else {}
        ray_config = RayConfig(address=args.ray_address, env_actor_cpus=args.env_actor_cpus, **given)
    except ValueError as exc:
        raise ConfigError(f"invalid Ray options: {describe_validation_error(exc)}") from None
    connect(ray_config)
    return ray_config


#: Flags that only mean something with ``--executor ray`` (each defaults to None: "not given").
_RAY_ONLY = ("--ray-address", "--env-actors", "--env-actor-cpus", "--replicas", "--replica-cpus")


def check_ray_flags(args: Any, executor: str, flags: tuple[str, ...] = _RAY_ONLY) -> None:
    """A Ray-only flag given while the executor is not ``ray`` is a mistake, not something to ignore."""
    if executor == "ray":
        return
    for flag in flags:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            raise ConfigError(
                f"{flag} {value} needs --executor ray (it sets how environments or replicas run on Ray actors)"
            )


def environments_and_prompts(
    names: list[str],
    data: Path | None,
    episodes: int | None,
    seed: int,
    generated: int = 16,
) -> tuple[list[Sample], dict[str, Any]]:
    """The samples and ``task_to_env`` of ``--env`` names and the optional ``--data`` file (see the
    module docstring), read as training reads its sections (``inputs/read.py``); ``generated``:
    how many the generators make when ``episodes`` is not given."""
    from ..inputs.config import EnvConfig
    from ..inputs.data import even_counts
    from ..inputs.read import Prompts, read_inputs

    prompts = Prompts(
        path=data,
        cycle=True,
        count=episodes,
        generated=episodes or generated,
        seed=seed,
        counts=even_counts,
        env_flag="--env",
        data_flag="--data" if data is not None else "--data FILE.jsonl",
    )
    task_to_env, samples = read_inputs([EnvConfig(name=name) for name in names], prompts)
    return samples, task_to_env


def split_samples(specs: list, episodes: int, seed: int) -> list[Sample]:
    """Episodes spread evenly over environments, interleaved: a0 b0 a1 b1 ..."""
    from ..inputs.config import EnvConfig
    from ..inputs.data import even_counts, generated_samples

    return generated_samples([EnvConfig(name=spec.name) for spec in specs], episodes, seed, even_counts)
