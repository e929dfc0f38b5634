"""``rollforge rollout``: roll a model out on environments and write the results.

``--env`` takes what a training config's ``environments`` take: a bundled name, an OpenEnv server
URL, ``module:attribute`` or ``file.py:Class``; ``--env`` and ``--data`` are read by the function
training reads its inputs with (``inputs/read.py``), a name given twice refused as there; nothing
here enters ``train/``. Prompts come from the bundled environments' generators, episodes split
evenly over the ``--env`` environments (the first ones get the remainder) and interleaved, so every
environment runs from the start; or from ``--data FILE`` (rows as in training: ``prompt``, optional
``task_name``/``environment``), whose first ``--episodes`` rows are used (cycling through the file;
all rows by default).

Each finished episode is appended to ``trajectories.jsonl.partial`` as it completes (nothing
produced is lost if the run dies); at the end ``trajectories.jsonl`` is written in input order and
``metrics.json`` beside it. ``.partial`` never ends in a torn line: each record is one
``os.write`` of a whole line, and a write that fails part-way (a full disk) is cut back to the last
whole line. The first failing write stops the rollout and raises its ``OSError`` (naming the file;
``cli/main.py`` answers it in one line): ``.partial`` keeps the episodes written before it, and no
``trajectories.jsonl`` or ``metrics.json`` is left half-written. ``read_partial`` reads the whole
lines back and ignores an incomplete last one (a machine that lost power mid-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..chat.render import ChatRenderer
from ..errors import ConfigError
from ..files import atomic_write
from ..types import Sample, Trajectory


def add_parser(commands: Any) -> None:
    p = commands.add_parser("rollout", help="run multi-turn rollouts of a model on environments")
    p.add_argument("--model", default="smollm2-135m", help="local model directory, hub id or alias (smollm2-135m)")
    p.add_argument(
        "--env",
        action="append",
        dest="envs",
        metavar="NAME",
        help="a bundled environment, an OpenEnv URL, module:attr or file.py:Class (repeatable)",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="prompts file (.jsonl/.json/.parquet, columns as in training); needed by non-bundled --env",
    )
    p.add_argument("--episodes", type=int, default=None, help="episodes (default 16; with --data, every row)")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--mode", choices=["async", "lockstep"], default="async")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--greedy", action="store_true", help="greedy decoding (overrides --temperature)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=2048)
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
    p.add_argument("--tool-parser", default=None, help="tool-call format (default: the model family's)")
    p.add_argument(
        "--backend",
        choices=["hf", "vllm", "openai"],
        default="hf",
        help="hf: transformers in this process; vllm: vLLM in this process; openai: a served model",
    )
    p.add_argument("--base-url", default=None, help="server of the openai backend, e.g. http://127.0.0.1:8000")
    p.add_argument("--served-model-name", default=None, help="model name on the openai backend's server")
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
    p.set_defaults(run=run)


def run(args: Any) -> int:
    from ..rollout.config import RolloutConfig

    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    check_out_dir(args.out, "--out")
    check_ray_flags(args, args.executor)
    if args.executor == "ray" and args.engine_workers != 1:
        raise ConfigError(
            f"--engine-workers {args.engine_workers} runs with --executor local only (Ray actors "
            "already take the environments out of this process)"
        )
    config = RolloutConfig.build(
        mode=args.mode,
        max_turns=args.max_turns,
        max_seq_len=args.max_seq_len,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        greedy=args.greedy,
        concurrency=args.concurrency,
        engine_workers=args.engine_workers,
        episode_timeout=args.episode_timeout,
        **({} if args.step_timeout is None else {"step_timeout": args.step_timeout}),
        seed=args.seed,
        tool_parser=args.tool_parser,
    )
    from ..chat.toolcalls import get_parser

    if args.tool_parser is not None:  # an unknown name fails now, not once the episodes run
        get_parser(args.tool_parser)
    samples, task_to_env = environments_and_prompts(args.envs or ["arithmetic"], args.data, args.episodes, args.seed)

    from ..backends.config import BackendConfig
    from ..models import load_tokenizer
    from ..rollout.checks import check_prompt_lengths

    backend_config = BackendConfig(
        kind=args.backend,
        model=args.model,
        base_url=args.base_url,
        served_model_name=args.served_model_name,
        concurrency=args.concurrency,
        seed=args.seed,
        replicas=1 if args.replicas is None else args.replicas,
        replica_cpus=args.replica_cpus,
        check_reachable=True,
    )
    tokenizer = load_tokenizer(args.model)
    renderer = ChatRenderer(tokenizer)
    # the engine's own check, made before the model loads and naming the flag
    check_prompt_lengths(
        samples, renderer, config.max_seq_len, "--max-seq-len", task_to_env, renderer.parser(config.tool_parser)
    )
    ray_config = _ray_config(args)
    result = asyncio.run(_rollout(samples, task_to_env, backend_config, renderer, ray_config, config, args.out))
    m = result.metrics
    print(
        f"{m['episodes']} episodes, {m['total_turns']} turns, mean reward {_reward(m['mean_total_reward'])}, "
        f"errors {m['errors'] or 'none'}, {m['wall_seconds']:.1f}s -> {args.out}"
    )
    return 0


def _reward(mean: float | None) -> str:
    return "unknown (every episode ended in an infrastructure failure)" if mean is None else f"{mean:.3f}"


async def _rollout(samples, task_to_env, backend_config, renderer, ray_config, config, out: Path):
    """The whole rollout on one event loop: the backend (replicas first), then the environments."""
    from ..cluster.executor import placed
    from ..cluster.generation import open_generation

    async with open_generation(backend_config, tokenizer=renderer.tokenizer) as backend:
        with placed(task_to_env, ray_config) as where:
            return await run_with_progress(samples, where, backend, renderer, config, out)


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


def check_out_dir(out: Path, flag: str) -> None:
    """An output directory, existing or not, but not a file."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{flag} {str(out)!r} is an existing file; expected a directory (existing or new)")


def environments_and_prompts(
    names: list[str],
    data: Path | None,
    episodes: int | None,
    seed: int,
) -> tuple[list[Sample], dict[str, Any]]:
    """The samples and ``task_to_env`` of ``--env`` names and the optional ``--data`` file (see the
    module docstring), read as training reads its sections (``inputs/read.py``)."""
    from ..inputs.config import EnvConfig
    from ..inputs.data import even_counts
    from ..inputs.read import Prompts, read_inputs

    prompts = Prompts(
        path=data,
        cycle=True,
        count=episodes,
        generated=episodes or 16,
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


async def run_with_progress(samples, task_to_env, backend, renderer, config, out: Path):
    """Roll out with a progress bar, streaming episodes to ``.partial``, then write the results.
    The caller opened ``backend`` and closes it."""
    from tqdm import tqdm

    from ..rollout.engine import arollout

    out.mkdir(parents=True, exist_ok=True)
    partial = out / "trajectories.jsonl.partial"
    bar = tqdm(total=len(samples), desc="episodes", unit="ep")
    failed: list[OSError] = []  # the first failing write, which stops the rollout
    with PartialWriter(partial) as stream:

        def on_episode(trajectory: Trajectory) -> None:
            bar.set_postfix(reward=f"{trajectory.total_reward:.2f}", refresh=False)
            bar.update()
            if failed:
                return
            try:
                stream.append(trajectory.to_json())
            except OSError as exc:
                failed.append(exc)
                rolling.cancel()

        rolling = asyncio.ensure_future(
            arollout(samples, task_to_env, backend, renderer, config, on_episode=on_episode)
        )
        try:
            result = await rolling
        except asyncio.CancelledError:
            if failed:
                raise failed[0] from None
            raise
        finally:
            bar.close()
    write_results(out, result.trajectories, result.metrics)
    partial.unlink()
    return result


class PartialWriter:
    """Appends JSON records to a file, each as one whole line (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0

    def append(self, record: dict) -> None:
        data = (json.dumps(record) + "\n").encode()
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError as exc:
            with contextlib.suppress(OSError):  # cut the torn line off again
                os.ftruncate(self._fd, self._size)
                os.lseek(self._fd, self._size, os.SEEK_SET)
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        self._size += written

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "PartialWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_partial(path: Path) -> list[dict]:
    """The records of a ``.partial`` file; an incomplete last line (no newline) is ignored."""
    data = Path(path).read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in whole.decode().splitlines() if line]


def write_results(out: Path, trajectories, metrics: dict) -> None:
    """``trajectories.jsonl`` (input order) and ``metrics.json``, each written atomically."""
    atomic_write(out / "trajectories.jsonl", "".join(json.dumps(t.to_json()) + "\n" for t in trajectories))
    atomic_write(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
