"""Training settings: one closed, typed, documented tree, loaded from YAML and overridable with
``--set section.key=value``. Every section forbids unknown keys; a misspelled key is a
``ConfigError`` that names the nearest valid key. Each field is documented by the docstring under
it (``rollforge train --help-config`` prints them). The ``environments`` and ``data`` sections
(``EnvConfig``, ``DataConfig``) live with what reads them, in ``inputs/config.py``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..cluster.config import RayConfig
from ..errors import ConfigError
from ..inputs.config import DataConfig, EnvConfig, RewardConfig
from ..rollout.config import RolloutConfig, describe_validation_error
from .config_files import check_keys, read_config_data, with_section_defaults
from .trackers import TrackerName


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ModelConfig(_Section):
    name: str = "smollm2-135m"
    """A local model directory, a cached hub id, or an alias (``smollm2-135m``)."""
    device: str = "auto"
    """Where the model trains (and the ``hf`` backend generates): ``auto`` (CUDA when PyTorch sees a
    GPU, else CPU), ``cpu``, ``cuda`` or ``cuda:N``. A GPU that is not there is an error at start."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute precision: ``auto`` is bfloat16 on a GPU, float32 on CPU. Trained weights and AdamW
    state stay float32 (master weights); with bfloat16 the update's forward passes run under
    ``torch.autocast``. Frozen weights (the KL reference, a LoRA base) are stored in this dtype."""
    generation_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The backend's precision (``auto``: ``dtype``'s; CPU decode is faster in float32). A quickstart
    with a bfloat16 update and float32 generation broke its tool-call format in 2 of 2 runs."""
    backend: Literal["hf", "vllm", "openai"] = "hf"
    """Generation backend. ``hf`` generates with the trained model object itself (no sync needed);
    the others receive the new weights after every update."""
    base_url: str | None = None
    """Server URL for the ``openai`` backend (a ``vllm serve`` of the same model; see README)."""
    served_model_name: str | None = None
    """The server's model name for the ``openai`` backend (None: its only model)."""

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value.strip().lower()):
            raise ValueError(f"unknown device {value!r}; expected auto, cpu, cuda or cuda:N")
        return value.strip().lower()


class VLLMConfig(_Section):
    colocate: bool = False
    """Run the in-process vLLM engine on the training GPU with vLLM's sleep mode: it wakes for the
    rollout and sleeps, releasing its GPU memory, during each update (needs ``model.backend: vllm``
    and a CUDA build of vLLM)."""
    gpu_memory_utilization: float = Field(0.4, gt=0, le=1)
    """Share of the GPU's memory the colocated engine may take (weights and KV cache); the rest
    stays for training."""
    sleep_level: Literal[1, 2] = 2
    """While asleep the engine's weights are offloaded to CPU memory (1) or discarded (2: the
    trainer sends the new weights after every update anyway). LoRA runs need 1: only the adapter
    is sent, the base weights must survive the sleep."""

    def backend_options(self, dtype: Any) -> dict[str, Any]:
        """Fields of ``VLLMSettings``: the engine computes in the trainer's resolved precision
        ``dtype`` (``torch.bfloat16`` or its name) and, when colocated, has a sleep mode and a GPU
        memory share (its KV cache sized from that share)."""
        options: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch.")}
        if self.colocate:
            options.update(
                sleep_level=self.sleep_level, gpu_memory_utilization=self.gpu_memory_utilization, kv_cache_gib=None
            )
        return options


class LoraConfig(_Section):
    enabled: bool = False
    """Train a LoRA adapter (``peft``) instead of all weights."""
    r: int = Field(16, ge=1)
    """Rank of the adapter matrices."""
    alpha: int = Field(32, ge=1)
    """Scale of the adapter update (alpha / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or ``all-linear``."""


class AlgorithmConfig(_Section):
    batch_size: int = Field(8, ge=1)
    """Prompts per step."""
    group_size: int = Field(4, ge=2)
    """Episodes per prompt (the GRPO group)."""
    advantage: Literal["grpo", "grpo_no_std", "dr_grpo", "rloo"] = "grpo"
    """``grpo``: (r - group mean) / group std. ``grpo_no_std`` and ``dr_grpo``: r - group mean
    (Dr.GRPO, pair it with ``loss_aggregation: fixed``). ``rloo``: r - mean of the other members."""
    loss_aggregation: Literal["token", "sequence", "fixed"] = "token"
    """``token``: mean over all policy tokens of the batch. ``sequence``: mean per episode, then over
    episodes. ``fixed``: sum over tokens / (episodes x ``max_loss_tokens``) (Dr.GRPO)."""
    max_loss_tokens: int | None = Field(None, ge=1)
    """Normaliser of ``fixed`` aggregation; default: rollout max_new_tokens x max_turns."""
    clip_low: float = Field(0.2, ge=0)
    """Importance ratios below 1 - clip_low are clipped. Unset, ``policy_loss``'s own: ppo 0.2,
    gspo 3e-4 (of the sequence ratio), cispo 1.0 (no lower bound)."""
    clip_high: float = Field(0.2, ge=0)
    """Importance ratios above 1 + clip_high are clipped (raise it for DAPO's clip-higher). Unset,
    ``policy_loss``'s own: ppo 0.2, gspo 4e-4, cispo 3.0 (weights capped at 4)."""
    kl_beta: float = Field(0.0, ge=0)
    """Weight of the k3 KL estimate to the reference (initial) model; 0 loads no reference."""
    skip_zero_advantage: bool = True
    """Do not forward rollouts of zero advantage (no KL term), nor step on a batch of only those."""
    dynamic_sampling: bool = False
    """Dynamic sampling (DAPO, Yu et al. 2025): drop the groups whose known rewards are all equal and roll
    out more prompts until batch_size groups with reward variance are kept (``train/sampling.py``)."""
    dynamic_sampling_max_rounds: int = Field(4, ge=1)
    """Most rollout rounds of a step with dynamic_sampling, the first included (each draws at most
    batch_size prompts); when they are spent the step trains on the groups kept so far."""
    epochs_per_batch: int = Field(1, ge=1)
    """Optimizer steps on each rollout batch (ratios against the generation logprobs, or the
    proximal policy under an ``off_policy_correction``)."""
    env_reward_weight: float = 1.0
    """Weight of the environments' own rewards (step rewards and ``get_reward()``)."""
    max_staleness: int = Field(0, ge=0)
    """Weight versions a trained token may lag the update it is trained in. 0: the synchronous loop
    (roll out, update, push, repeat). k >= 1: generation goes on while the trainer updates, the
    backend takes new weights between requests, and a group starts only where its tokens can be
    trained within k versions (``recipes/grpo_async.py``)."""
    exact_staleness: bool = False
    """With max_staleness k >= 1: step s's whole batch generates at weight version max(start, s - 1 - k)
    (a push waits for the batches that must see the older weights): samples follow from the seeds,
    not from timing."""
    off_policy_correction: Literal["auto", "none", "decoupled", "masked"] = "auto"
    """How the loss corrects for the lag between the behaviour policy (that generated) and the
    policy being updated (``losses.py``). ``none``: ratios against the generation logprobs (today's
    loss). ``decoupled``: clipped ratios against the proximal policy (the weights before this
    update) times the behaviour weight min(pi_prox / pi_behav, importance_cap) (AReaL).
    ``masked``: the same ratios, and tokens whose behaviour weight leaves [1/cap, cap] are dropped.
    ``auto``: ``none`` when max_staleness is 0 and model.backend is ``hf`` (the trained model
    generates), else ``decoupled`` (the logprobs of older weights or of another engine: ``vllm``,
    ``openai``). ``mismatch/*`` metrics show the engine/trainer gap whatever the choice."""
    importance_cap: float = Field(2.0, gt=1)
    """Cap of the behaviour importance weight (``decoupled``), or the band (``masked``)."""
    policy_loss: Literal["ppo", "gspo", "cispo"] = "ppo"
    """The policy-gradient objective (``train/policy_losses.py``). ``ppo``: PPO's clipped token ratio
    (GRPO, DAPO). ``gspo``: one ratio per sequence, the geometric mean of its tokens', clipped per
    sequence (Zheng et al. 2025; the paper's loss with ``loss_aggregation: sequence``). ``cispo``:
    REINFORCE weighted by the detached, clipped token ratio, so no token loses its gradient
    (MiniMax-M1 2025). Each brings its own clip_low/clip_high when those are unset."""
    infra_retries: int = Field(2, ge=0)
    """Times an episode that failed for infrastructure reasons (backend error, lost connection,
    hung environment) is run again before it is left out of its group's baseline."""

    @model_validator(mode="before")
    @classmethod
    def _clip_of_the_policy_loss(cls, data: Any) -> Any:
        """clip_low/clip_high left unset take ``policy_loss``'s own (its class's ``default_clip``;
        ppo's are the fields' defaults), so the config a run writes holds the values it ran with."""
        clips = {"gspo": (3e-4, 4e-4), "cispo": (1.0, 3.0)}
        if isinstance(data, dict) and data.get("policy_loss") in clips:
            low, high = clips[data["policy_loss"]]
            data = {"clip_low": low, "clip_high": high, **data}
        return data


class OptimConfig(_Section):
    lr: float = Field(1e-5, gt=0)
    """Peak learning rate of AdamW."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW moment decay rates."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warm-up (decaying to 0 at the last step)."""
    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warm-up from 0."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm; None: no clipping."""
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    """Padded tokens per forward/backward pass; the batch is accumulated over as many passes as needed.
    ``auto``: 4096 on a CPU; on CUDA, from the free memory and the model's size
    (``micro_batches.micro_batch_tokens_for``; never yet run on a GPU)."""
    share_prompts: bool | Literal["auto"] = "auto"
    """Run a GRPO group's rows behind one pass of their shared prompt. ``auto``: on a CPU only (on an
    H100 that update took 2.9 s, padded rows 1.05 s; see ``micro_batches.shares_prompts``)."""


class TrainConfig(_Section):
    out: str = "runs/train"
    """Run directory: metrics.jsonl, checkpoints/, trajectories/, report."""
    steps: int = Field(40, ge=1)
    """Training steps (one rollout batch and its update each)."""
    seed: int = 0
    """Seeds the prompt order, sampling and initialisation of everything random."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    environments: list[EnvConfig] = [EnvConfig(name="arithmetic")]
    """The environments episodes run in; each prompt goes to the one its ``task_name`` names."""
    data: DataConfig = DataConfig()
    rewards: list[RewardConfig] = []
    """Reward functions whose weighted values add to the environments' own rewards."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    optim: OptimConfig = OptimConfig()
    rollout: RolloutConfig = RolloutConfig(max_turns=4, max_new_tokens=64, max_seq_len=1024, concurrency=32)
    executor: Literal["local", "ray"] = "local"
    """Where environments run: ``local`` (this process) or ``ray`` (pools of Ray actors, see the
    ``ray`` section; needs ``rollforge[ray]``)."""
    ray: RayConfig = RayConfig()
    checkpoint_every: int = Field(10, ge=0)
    """Steps between checkpoints (0: only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """Most recent checkpoints kept on disk."""
    save_trajectories: bool = True
    """Write each step's trajectories to ``trajectories/step-NNNNNN.jsonl``."""
    report_to: list[TrackerName] | None = None
    """Trackers sent the config, each step's metrics and a few completions (with save_trajectories),
    several at once: tensorboard, wandb, trackio, mlflow (each its extra, e.g. ``rollforge[wandb]``);
    ``[]`` or ``none``: no tracker; null: tensorboard when installed."""
    eval_episodes: int = Field(0, ge=0)
    """Greedy held-out episodes evaluated before and after training (0: none)."""
    eval_every: int = Field(0, ge=0)
    """Steps between held-out evaluations during training too (``eval.json`` key ``step-N``; 0: only
    before and after). Needs ``eval_episodes``."""
    vllm: VLLMConfig = VLLMConfig()

    @field_validator("report_to", mode="before")
    @classmethod
    def _trackers_as_a_list(cls, value: Any) -> Any:
        """``report_to: wandb`` (``--set report_to=wandb``) is ``[wandb]``, ``none`` is ``[]`` (TRL's
        spellings); a tracker named twice would start two runs."""
        if isinstance(value, str):
            value = [] if value == "none" else [value]
        if isinstance(value, list) and (twice := [v for i, v in enumerate(value) if v in value[:i]]):
            raise ValueError(f"report_to names {twice[0]!r} twice; each tracker gets one run")
        return value

    @model_validator(mode="after")
    def _settings_need_their_partners(self) -> TrainConfig:
        """A setting that does nothing without another is a mistake: ``eval_every`` without
        ``eval_episodes``; a ``ray`` key given a value of its own under ``executor: local`` (keys set
        to their defaults pass: the ``config.yaml`` a local run writes has them all)."""
        if self.eval_every and not self.eval_episodes:
            raise ValueError(
                f"eval_every={self.eval_every} needs eval_episodes > 0: the held-out episodes it evaluates"
            )
        if self.executor == "ray":
            return self
        given = [
            k
            for k in type(self.ray).model_fields
            if k in self.ray.model_fields_set and getattr(self.ray, k) != getattr(RayConfig(), k)
        ]
        if given:
            raise ValueError(
                f"ray.{given[0]}={getattr(self.ray, given[0])!r} needs executor: ray (or --executor ray); "
                f"with executor {self.executor!r} nothing runs on Ray"
            )
        return self

    @model_validator(mode="after")
    def _dynamic_sampling_supported(self) -> TrainConfig:
        """Dynamic sampling runs in the synchronous loop on one rank (torchrun ranks: ``recipes/grpo.py``)."""
        algo = self.algorithm
        if not algo.dynamic_sampling:
            rounds, default = algo.dynamic_sampling_max_rounds, AlgorithmConfig().dynamic_sampling_max_rounds
            if "dynamic_sampling_max_rounds" in algo.model_fields_set and rounds != default:
                raise ValueError(
                    f"algorithm.dynamic_sampling_max_rounds={rounds} needs algorithm.dynamic_sampling: true"
                )
            return self
        if algo.max_staleness:
            raise ValueError(
                f"algorithm.dynamic_sampling with max_staleness={algo.max_staleness} is not supported "
                "yet: set max_staleness 0 (the synchronous loop) or dynamic_sampling false"
            )
        if self.executor == "ray" and self.ray.training_workers > 1:
            raise ValueError(
                f"algorithm.dynamic_sampling with ray.training_workers={self.ray.training_workers} is "
                "not supported yet: train on one rank or set dynamic_sampling false"
            )
        return self

    @model_validator(mode="after")
    def _colocation_consistent(self) -> TrainConfig:
        if not self.vllm.colocate:
            return self
        if self.model.backend != "vllm":
            raise ValueError(f"vllm.colocate needs model.backend 'vllm', got {self.model.backend!r}")
        if self.model.device == "cpu":
            raise ValueError("vllm.colocate shares a GPU between training and vLLM, but model.device is 'cpu'")
        if self.model.device not in ("auto", "cuda", "cuda:0"):
            raise ValueError(
                f"vllm.colocate runs vLLM on the first visible GPU, but model.device is {self.model.device!r}; "
                f"choose the GPU with CUDA_VISIBLE_DEVICES and keep model.device 'cuda'"
            )
        if self.algorithm.max_staleness:
            raise ValueError(
                f"algorithm.max_staleness={self.algorithm.max_staleness} with vllm.colocate: a colocated engine "
                "sleeps while the trainer updates, so nothing can overlap; set max_staleness 0 or serve the model apart"
            )
        if self.lora.enabled and self.vllm.sleep_level == 2:
            raise ValueError(
                "vllm.sleep_level 2 discards the engine's base weights, which a LoRA run never re-sends; use vllm.sleep_level 1"
            )
        return self


def load_config(path: str | Path | None = None, overrides: list[str] = (), **values: Any) -> TrainConfig:
    """A ``TrainConfig`` from a YAML file, then ``key.sub=value`` overrides, then keyword values."""
    return build_config(read_config_data(path, overrides, values))


def build_config(data: dict[str, Any]) -> TrainConfig:
    check_keys(TrainConfig, data, ())
    try:
        return TrainConfig(**with_section_defaults(TrainConfig, data))
    except ValidationError as exc:
        raise ConfigError(f"invalid training config: {describe_validation_error(exc)}") from None
