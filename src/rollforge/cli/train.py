"""``rollforge train``, ``rollforge quickstart`` and ``rollforge eval``.

``train CONFIG.yaml [--set key=value ...] [--resume | --overwrite]`` runs the GRPO loop of
``train/launch.py``: into an ``out`` that holds no run yet, or continuing (``--resume``) or replacing
(``--overwrite``) the one it holds; interrupted (Ctrl-C), it exits 130 naming the step to resume after.
``quickstart`` runs ``train/quickstart.py``: a supervised warm-up on expert demonstrations
(``presets/quickstart_warmup.yaml``; ``--set warmup.KEY=VALUE`` overrides it), then ``train`` on
``presets/quickstart.yaml`` from the warmed-up weights, then the report of both phases. ``eval`` rolls a model or checkpoint out greedily (or
``--samples N`` times per prompt) on the backend ``--backend`` names (as ``rollforge rollout``:
``hf``, ``vllm``, or ``openai`` with ``--base-url``) and prints mean reward and pass@k as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

def add_parser(commands: Any) -> None:
    train = commands.add_parser("train", help="train a model with GRPO from a YAML config")
    train.add_argument("config", nargs="?", type=Path, help="YAML config (omit with --help-config)")
    _common(train)
    start = train.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the run directory's last checkpoint")
    start.add_argument("--overwrite", action="store_true", help="delete the run that out holds, then start over")
    train.add_argument("--help-config", action="store_true", help="print every config key with its default and meaning")
    train.add_argument("--nproc", type=int, default=None, metavar="N",
                       help="train on N ranks of this node with FSDP2: runs `torchrun --nproc-per-node N -m rollforge train ...`")
    train.add_argument("--nnodes", type=int, default=1, help="nodes taking part (with --nproc; torchrun's rendezvous)")
    train.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                       help="rendezvous of a several-node run (with --nnodes > 1), as torchrun's --rdzv-endpoint")
    train.set_defaults(run=_train)

    quick = commands.add_parser("quickstart", help="SmolLM2-135M on CPU: SFT warm-up on calculator tool-call demonstrations, then GRPO that learns which tool each question needs")
    quick.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    quick.add_argument("--steps", type=int, default=None)
    quick.add_argument("--model", default=None, help="model directory or alias (default smollm2-135m)")
    quick.add_argument("--backend", choices=["hf", "vllm", "openai"], default=None)
    quick.add_argument("--base-url", default=None, help="server URL for --backend openai")
    _common(quick)
    start = quick.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="reuse the base evaluation and a finished warm-up, continue GRPO")
    start.add_argument("--overwrite", action="store_true", help="delete the quickstart that --out holds, then start over")
    quick.set_defaults(run=_quickstart)

    ev = commands.add_parser("eval", help="evaluate a model or checkpoint: mean reward and pass@k")
    ev.add_argument("--model", default="smollm2-135m", help="model directory, checkpoint model/ directory or alias")
    ev.add_argument("--env", action="append", dest="envs", metavar="NAME", help="bundled environment (repeatable)")
    ev.add_argument("--episodes", type=int, default=64, help="prompts (spread over the environments)")
    ev.add_argument("--samples", type=int, default=1, help="samples per prompt (1: greedy)")
    ev.add_argument("--max-turns", type=int, default=4)
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument("--success-threshold", type=float, default=1.0, help="total reward counted as a pass")
    ev.add_argument("--seed", type=int, default=1234)
    ev.add_argument("--backend", choices=["hf", "vllm", "openai"], default="hf",
                    help="hf: transformers in this process; vllm: vLLM in this process; openai: a served model")
    ev.add_argument("--base-url", default=None, help="server of the openai backend, e.g. http://127.0.0.1:8000")
    ev.add_argument("--served-model-name", default=None, help="model name on the openai backend's server")
    ev.add_argument("--out", type=Path, default=None, help="write metrics.json (this result) and trajectories.jsonl here")
    ev.set_defaults(run=_eval)


def _common(p: Any) -> None:
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE",
                   help="override a config key, e.g. --set algorithm.batch_size=4 (repeatable)")
    p.add_argument("--executor", choices=["local", "ray"], default=None,
                   help="where environments run (overrides the config's executor; ray: see the ray section)")
    p.add_argument("--ray-address", default=None,
                   help="Ray cluster to join with --executor ray (auto, ray://host:10001); default: a private local instance")


def _overrides(args: Any) -> list[str]:
    extra = [f"executor={args.executor}"] if args.executor else []
    if args.ray_address:
        extra.append(f"ray.address={args.ray_address}")
    return [*args.overrides, *extra]


def _load_config(path: Path, overrides: list[str], args: Any):
    """The training config; ``--ray-address`` is refused when the executor it ends up with (the
    config's, or ``--executor``) is not ``ray``."""
    from ..cli.rollout import check_ray_flags
    from ..train.config import build_config, read_config_data

    data = read_config_data(path, overrides, {})
    check_ray_flags(args, data.get("executor", "local"), ("--ray-address",))
    return build_config(data)


def _train(args: Any) -> int:
    from ..errors import ConfigError
    from ..train.config import TrainConfig
    from ..train.config_files import describe_config
    from ..train.launch import train

    if args.help_config:
        print(describe_config(TrainConfig))
        return 0
    if args.config is None:
        raise ConfigError("rollforge train needs a config file (see examples/), or --help-config")
    config = _load_config(args.config, _overrides(args), args)
    if args.nproc is not None:
        return _torchrun(args)
    try:
        result = train(config, resume=args.resume, overwrite=args.overwrite)
    except KeyboardInterrupt:  # the step in flight finished its update and checkpoint, or was dropped
        print(f"rollforge: interrupted; {_where_to_continue(Path(config.out))}", file=sys.stderr)
        return 130
    print(f"trained {result.steps} steps -> {result.out}")
    return 0


def _where_to_continue(out: Path) -> str:
    from ..train import checkpoint as ckpt

    latest = ckpt.latest_checkpoint(out / "checkpoints")
    if latest is not None:
        return f"--resume continues after step {ckpt.step_of(latest)} (checkpoint {str(latest)!r})"
    if ckpt.recorded(out) is not None:
        return "no checkpoint was written yet: start over with --overwrite"
    return "nothing was recorded: run it again"


def _torchrun(args: Any) -> int:
    """Re-run this command under torchrun on ``--nproc`` ranks (per node), without the launcher flags."""
    import subprocess
    import sys

    from ..errors import ConfigError

    if args.nproc < 1 or args.nnodes < 1:
        raise ConfigError(f"--nproc and --nnodes must be >= 1, got {args.nproc} and {args.nnodes}")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")
    where = (["--nnodes", str(args.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint]
             if args.nnodes > 1 else ["--standalone"])
    command = [sys.executable, "-m", "torch.distributed.run", *where, "--nproc-per-node", str(args.nproc),
               "-m", "rollforge", "train", str(args.config), *[a for o in args.overrides for a in ("--set", o)]]
    if args.executor:
        command += ["--executor", args.executor]
    if args.ray_address:
        command += ["--ray-address", args.ray_address]
    command += [flag for flag, given in (("--resume", args.resume), ("--overwrite", args.overwrite)) if given]
    return subprocess.call(command)


def _quickstart(args: Any) -> int:
    from ..cli.rollout import check_out_dir
    from ..train.quickstart import PRESETS, quickstart
    from ..train.sft_config import load_sft_config

    check_out_dir(args.out, "--out")
    overrides = [f"out={args.out}"]
    for key, value in (("steps", args.steps), ("model.name", args.model), ("model.backend", args.backend),
                       ("model.base_url", args.base_url)):
        if value is not None:
            overrides.append(f"{key}={value}")
    grpo = [o for o in _overrides(args) if not o.startswith("warmup.")]
    warmup = [o.removeprefix("warmup.") for o in args.overrides if o.startswith("warmup.")]
    config = _load_config(PRESETS / "quickstart.yaml", [*overrides, *grpo], args)
    result = quickstart(config, load_sft_config(PRESETS / "quickstart_warmup.yaml", warmup), resume=args.resume,
                        overwrite=args.overwrite)
    print(result.report.read_text())
    return 0


def _eval(args: Any) -> int:
    import asyncio

    from ..backends.config import BackendConfig
    from ..backends.opening import open_backend
    from ..chat.render import ChatRenderer
    from ..cli.rollout import check_out_dir, split_samples, write_results
    from ..envs.library import get_env_spec
    from ..errors import ConfigError
    from ..models import load_tokenizer
    from ..rollout.config import RolloutConfig
    from ..train.evaluate import aevaluate

    for flag, value in (("--episodes", args.episodes), ("--samples", args.samples)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.out is not None:
        check_out_dir(args.out, "--out")
    specs = [get_env_spec(name) for name in args.envs or ["arithmetic"]]
    prompts = split_samples(specs, args.episodes, args.seed)
    config = RolloutConfig.build(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                                 greedy=args.samples == 1, seed=args.seed)

    backend_config = BackendConfig(
        kind=args.backend, model=args.model, base_url=args.base_url, served_model_name=args.served_model_name,
        seed=args.seed, check_reachable=True,
    )
    renderer = ChatRenderer(load_tokenizer(args.model))

    async def run():
        async with open_backend(backend_config, tokenizer=renderer.tokenizer) as backend:
            return await aevaluate(prompts, {s.name: s.build() for s in specs}, backend, renderer, config,
                                   samples_per_prompt=args.samples, success_threshold=args.success_threshold)

    result = asyncio.run(run())
    print(json.dumps(result.to_json(), indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_results(args.out, result.trajectories, result.to_json())
    return 0
