"""Supervised fine-tuning settings: a closed, typed tree like ``TrainConfig``, sharing its model,
LoRA, optimizer and rollout sections; loaded from YAML with ``--set key=value`` overrides.

Data comes from ``sources`` (trajectory files filtered by reward, conversations, expert
demonstrations), trained first, then from ``from_rollouts`` rounds when enabled: roll out the
current model ``samples_per_prompt`` times per prompt, keep the episodes whose reward is >=
``min_reward``, train on them; each round starts from the weights the previous one left
(expert iteration).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError
from ..inputs.config import EnvConfig
from ..rollout.config import RolloutConfig, describe_validation_error
from ..train.config import LoraConfig, ModelConfig, OptimConfig
from ..train.config_files import check_keys, read_config_data, with_section_defaults


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class TrajectoriesSource(_Section):
    kind: Literal["trajectories"]
    path: str
    """A ``trajectories.jsonl`` file or a glob (``runs/train/trajectories/step-*.jsonl``)."""
    min_reward: float | None = None
    """Keep episodes whose reward is >= this (training runs: ``reward``, else ``total_reward``);
    None keeps every episode that did not fail."""


class MessagesSource(_Section):
    kind: Literal["messages"]
    path: str
    """A ``.jsonl``/``.json``/``.parquet`` file or a saved ``datasets`` directory of conversations."""
    column: str = "messages"
    """The column holding each row's ``[{role, content}, ...]``; an optional ``tools`` column gives tool schemas."""


class ExpertSource(_Section):
    kind: Literal["expert"]
    env: str
    """A bundled environment with an expert: echo, calculator, catch, wordle, guess_number, shapes (images:
    a vision-language model)."""
    episodes: int = Field(64, ge=1)
    """Demonstrations rolled out (before the ``min_reward`` filter)."""
    min_reward: float | None = 1.0
    """Keep demonstrations whose reward is >= this (None: all that did not fail)."""
    options: dict[str, Any] = {}
    """Keyword arguments of the environment's sample generator."""


Source = Annotated[Union[TrajectoriesSource, MessagesSource, ExpertSource], Field(discriminator="kind")]


class FromRolloutsConfig(_Section):
    enabled: bool = False
    """Rejection sampling from the current model after the sources (``rollforge sft --from-rollouts``)."""
    environments: list[EnvConfig] = [EnvConfig(name="catch")]
    """Environments whose generators give the prompts (bundled names)."""
    prompts: int = Field(16, ge=1)
    """Prompts per round."""
    samples_per_prompt: int = Field(8, ge=1)
    """Episodes rolled out per prompt (best-of-n)."""
    min_reward: float = 1.0
    """Keep episodes whose total reward is >= this."""
    rounds: int = Field(1, ge=1)
    """Roll out, filter, train; repeated this many times, each from the last round's weights."""


class SFTConfig(_Section):
    out: str = "runs/sft"
    """Run directory: metrics.jsonl, checkpoints/, config.yaml."""
    seed: int = 0
    """Seeds the example order, sampling and everything random."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    optim: OptimConfig = OptimConfig(lr=1e-4)
    sources: list[Source] = []
    """Data trained on first; each item has a ``kind``: ``trajectories``, ``messages`` or ``expert``."""
    from_rollouts: FromRolloutsConfig = FromRolloutsConfig()
    rollout: RolloutConfig = RolloutConfig(max_turns=8, max_new_tokens=128, max_seq_len=2048, concurrency=32)
    """Rollouts of expert demonstrations and of ``from_rollouts`` (``tool_parser`` sets the call format)."""
    batch_size: int = Field(8, ge=1)
    """Examples per optimizer step."""
    epochs: int = Field(1, ge=1)
    """Passes over each phase's examples (the sources, then each rollout round)."""
    shuffle: bool = True
    """Each epoch in a seeded random order; False: in the examples' order (the sources' order, so a
    source built in balanced blocks, such as calculator's ``balanced: true``, gives balanced batches)."""
    max_steps: int | None = Field(None, ge=1)
    """Stop after this many optimizer steps in all (None: every epoch of every phase)."""
    checkpoint_every: int = Field(0, ge=0)
    """Steps between checkpoints (0: only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Most recent checkpoints kept on disk."""


def load_sft_config(path: str | Path | None = None, overrides: list[str] = (), **values: Any) -> SFTConfig:
    """An ``SFTConfig`` from a YAML file, then ``key.sub=value`` overrides, then keyword values."""
    data = read_config_data(path, overrides, values)
    check_keys(SFTConfig, {k: v for k, v in data.items() if k != "sources"}, ())
    for n, source in enumerate(data.get("sources") or []):
        _check_source(source, n)
    try:
        return SFTConfig(**with_section_defaults(SFTConfig, data))
    except ValidationError as exc:
        raise ConfigError(f"invalid sft config: {describe_validation_error(exc, tags=_KINDS)}") from None


_KINDS = {"trajectories": TrajectoriesSource, "messages": MessagesSource, "expert": ExpertSource}


def _check_source(source: Any, n: int) -> None:
    if not isinstance(source, dict) or source.get("kind") not in _KINDS:
        got = source.get("kind") if isinstance(source, dict) else source
        raise ConfigError(f"sources[{n}]: kind {got!r} is not one of {sorted(_KINDS)}")
    check_keys(_KINDS[source["kind"]], source, (f"sources[{n}]",))
