"""The flags ``rollforge rollout`` and ``rollforge eval`` share, and what they are read into.

- what runs: ``--env`` (repeatable: a bundled name, an OpenEnv URL, ``module:attribute`` or
  ``file.py:Class``), ``--data`` (a prompts file, needed by environments without a generator) and
  ``--reward module.py:function`` (repeatable: a TRL-style reward function, read as the training
  config's ``rewards`` are, ``inputs/rewards.py``);
- the backend: ``--backend``, ``--base-url``, ``--served-model-name`` (``backend_config``);
- ``--max-seq-len``: given, it is refused in one line when the model handles fewer positions (read
  from its ``config.json``); left out, it is ``DEFAULT_MAX_SEQ_LEN`` or the model's positions when
  fewer. ``open_renderer`` does that and checks the prompts against it, before the model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..types import Sample

#: ``--max-seq-len`` when it is not given (lowered to the model's positions when they are fewer).
DEFAULT_MAX_SEQ_LEN = 2048
#: How messages name the flag that gives reward functions.
REWARD_FLAG = "--reward module.py:function"


def add_input_flags(p: Any, episodes_help: str) -> None:
    p.add_argument("--model", default="smollm2-135m", help="model directory, checkpoint model/ directory or alias")
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
    p.add_argument("--episodes", type=int, default=None, help=episodes_help)
    p.add_argument(
        "--reward",
        action="append",
        dest="rewards",
        metavar="FILE.py:FUNCTION",
        help="a reward function f(prompts, completions, environments, **columns), TRL-style, added to the "
        "environments' rewards (repeatable; module:function too)",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help=f"token limit of an episode (default {DEFAULT_MAX_SEQ_LEN}, or the model's positions when fewer)",
    )


def add_backend_flags(p: Any) -> None:
    p.add_argument(
        "--backend",
        choices=["hf", "vllm", "openai"],
        default="hf",
        help="hf: transformers in this process; vllm: vLLM in this process; openai: a served model",
    )
    p.add_argument("--base-url", default=None, help="server of the openai backend, e.g. http://127.0.0.1:8000")
    p.add_argument("--served-model-name", default=None, help="model name on the openai backend's server")


def backend_config(args: Any, **values: Any) -> Any:
    """The ``BackendConfig`` of the backend flags, with ``values`` (concurrency, replicas, ...)."""
    from ..backends.config import BackendConfig

    return BackendConfig(
        kind=args.backend,
        model=args.model,
        base_url=args.base_url,
        served_model_name=args.served_model_name,
        seed=args.seed,
        check_reachable=True,
        **values,
    )


def reward_functions(specs: Sequence[str] | None) -> list[Any]:
    """The ``--reward`` functions, loaded as a training config's ``rewards`` (weight 1 each)."""
    from ..inputs.config import RewardConfig
    from ..inputs.rewards import load_reward_functions

    return load_reward_functions([RewardConfig(function=spec) for spec in specs or ()])


def open_renderer(args: Any, config: Any, samples: Sequence[Sample], task_to_env: Mapping[str, Any]) -> tuple[Any, Any]:
    """The chat renderer of ``--model`` and ``config`` with its ``max_seq_len`` fitted to the model
    (see the module docstring), the prompts checked against it: before the model loads."""
    from ..chat.render import ChatRenderer
    from ..models import load_tokenizer
    from ..rollout.checks import check_prompt_lengths, fit_max_seq_len, model_positions

    renderer = ChatRenderer(load_tokenizer(args.model))
    positions = model_positions(args.model)
    max_seq_len = fit_max_seq_len(args.max_seq_len, positions, "--max-seq-len", DEFAULT_MAX_SEQ_LEN)
    config = config.model_copy(update={"max_seq_len": max_seq_len})
    parser = renderer.parser(config.tool_parser)
    check_prompt_lengths(samples, renderer, max_seq_len, "--max-seq-len", task_to_env, parser, positions)
    return renderer, config
