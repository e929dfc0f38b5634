"""The sections of ``rollforge bench gpu``, one function each, every one returning a JSON-able dict
of figures (``gpu.py`` runs them at its boundary and turns what they raise into a failed section).

The model: ``build_model_dir`` initialises a model of a real architecture at random from one of the
configs in ``gpu/models/`` (copied from the published ``config.json``; weights are not needed for
speed) and saves it, with the offline tokenizer of ``rollforge.testing`` (byte-level BPE, 640
ids, ChatML), as an ordinary checkpoint directory that every section loads. The vocabulary is
the architecture's own (151,936 for Qwen, 128,256 for Llama), so the embedding and the output head
cost what they cost in the real model; the tokenizer's vocabulary is padded to it with placeholder
tokens (``pad_vocabulary``: the backend refuses ids outside the tokenizer). A random model samples
the end-of-turn token almost never: every completion runs to its token limit, which makes the
work per step fixed.

- ``grpo``: rollforge's trainer (``vs_trl.runners.run_rollforge``) on the ``arithmetic`` workload,
  HF backend generating from the trained model; float32 master weights, bfloat16 autocast on CUDA.
- ``trl``: TRL's ``GRPOTrainer`` (``vs_trl.trl_side.run_trl``) on the same model, rows, batch,
  group and lengths; the ratio of the mean timed steps (the first step of each is a warm-up).
- ``fsdp2``: a process group of one (NCCL on CUDA, gloo on CPU), the model wrapped by FSDP2 as the
  multi-rank trainer wraps it, updates, a checkpoint written (``save_checkpoint``) and resumed
  (``load_newest`` + ``restore``) into a fresh sharded model and optimizer; the next update's loss
  of the original and of the resumed model must agree.
- ``train_throughput``: ``bench train-throughput`` (random tokens, every token in the loss) at one
  pack of ``seq_len`` tokens per step.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..vs_trl.settings import Settings
from .settings import GpuSettings

#: The architectures shipped (``gpu/models/NAME.json``); ``tiny`` is for ``--quick``.
MODELS = ("qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b")


def model_spec(name: str) -> dict[str, Any]:
    """The config values of ``gpu/models/NAME.json``."""
    known = sorted(
        p.name.removesuffix(".json")
        for p in resources.files(__package__).joinpath("models").iterdir()
        if p.name.endswith(".json")
    )
    if name not in known:
        raise ConfigError(f"unknown model {name!r} for bench gpu; expected one of {', '.join(known)}")
    return json.loads(resources.files(__package__).joinpath("models", f"{name}.json").read_text())


def build_model_dir(name: str, out: Path, where: Any, seed: int) -> dict[str, Any]:
    """Initialise ``name`` at random (on ``where``; seeded) and save it with the offline tokenizer
    to ``out`` (bfloat16 weights on CUDA, float32 on CPU); its sizes and the seconds it took."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ...testing import make_tokenizer

    began = time.perf_counter()
    tokenizer = make_tokenizer()
    spec = model_spec(name)
    config = AutoConfig.for_model(
        **spec,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    torch.manual_seed(seed)  # every device's generator: the same weights on every run
    with torch.device(where):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    pad_vocabulary(out / "tokenizer.json", spec["vocab_size"])
    params = sum(p.numel() for p in model.parameters())
    del model
    return {
        "architecture": spec["architectures"][0],
        "parameters": params,
        "vocab_size": spec["vocab_size"],
        "tokenizer_vocab": len(AutoTokenizer.from_pretrained(out)),
        "layers": spec["num_hidden_layers"],
        "hidden_size": spec["hidden_size"],
        "saved_dtype": str(dtype).removeprefix("torch."),
        "build_seconds": round(time.perf_counter() - began, 2),
    }


def failed(exc: Exception) -> dict[str, Any]:
    """A section's or candidate's entry for what it raised: its type and message on one line."""
    message = " ".join(str(exc).split())
    return {"status": "failed", "reason": f"{type(exc).__name__}: {message}"[:500]}


def release_memory() -> None:
    """Free what a section or candidate left: Python's garbage, CUDA's cached blocks, its peak."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def pad_vocabulary(path: Path, size: int) -> None:
    """Extend the BPE vocabulary of the tokenizer file ``path`` to ``size`` ids: every id the model
    can sample decodes (the backend refuses ids outside the tokenizer), to ``~`` and letters (no
    digits: the arithmetic reward reads numbers). No merge produces them, so encoding is unchanged."""
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    start = max([*vocab.values(), *(t["id"] for t in data.get("added_tokens", []))]) + 1
    if start > size:
        raise ConfigError(f"the tokenizer has {start} ids, more than the model's vocab_size {size}")
    for i in range(start, size):
        name, n = "", i - start
        while n or not name:
            name, n = chr(ord("a") + n % 26) + name, n // 26
        vocab[f"~{name}"] = i
    path.write_text(json.dumps(data, ensure_ascii=False))


def _meta_model(model_dir: Path) -> Any:
    """The model of ``model_dir`` on the meta device (no memory): for counting its FLOPs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))


def _settings(where: Any, s: GpuSettings) -> Settings:
    """``vs_trl.runners``'s settings for one GRPO run on ``where`` (bfloat16 autocast on CUDA)."""
    return Settings(
        steps=s.grpo_steps,
        batch_size=s.batch_size,
        generations=s.generations,
        max_completion_tokens=s.max_new_tokens,
        lr=1e-6,
        seed=s.seed,
        rollforge_mode="async",
        device=where.type,
        dtype="bfloat16" if where.type == "cuda" else "float32",
        skip_zero_advantage=False,  # a random model's rewards are all 0: the update is what is timed
    )


def grpo(model_dir: Path, where: Any, s: GpuSettings, scratch: Path) -> dict[str, Any]:
    """rollforge GRPO steps: step time and its split, generation and update tokens/s, update MFU."""
    import torch

    from ..train_throughput import model_flops_per_token, peak_flops
    from ..vs_trl import side_summary
    from ..vs_trl.runners import run_rollforge
    from ..vs_trl.workloads import arithmetic

    settings = _settings(where, s)
    run = run_rollforge(arithmetic(model_dir, seed=s.seed), settings, scratch / "rollforge")
    summary = side_summary([run])
    timed = run["steps"][1:]
    n = settings.completions
    generated = statistics.fmean(x["generated_tokens"] for x in timed)
    trained = statistics.fmean(x["trained_tokens"] for x in timed)
    phases = summary["phases_seconds_per_step"]
    seq_len = round(run["prompt_tokens"] + generated / n)
    _, flops_per_token = model_flops_per_token(_meta_model(model_dir), seq_len)
    update_tps = trained / phases["update"]
    peak, source = peak_flops(where, torch.bfloat16)
    return {
        "steps_timed": len(timed),
        "completions_per_step": n,
        "seconds_per_step": summary["seconds_per_step"],
        "split_seconds": {"rollout": phases["generation"], "update": phases["update"], "sync": phases["other"]},
        "generated_tokens_per_step": round(generated, 1),
        "trained_tokens_per_step": round(trained, 1),
        "update_micro_batches": [x["micro_batches"] for x in timed],  # optim.micro_batch_tokens: auto's split
        "generation_tokens_per_s": round(generated / phases["generation"], 1),
        "update_tokens_per_s": round(update_tps, 1),
        "update_flops_per_token": flops_per_token,
        "update_mfu": round(flops_per_token * update_tps / peak, 4) if peak else None,
        "peak_source": source,
        "step_seconds": summary["step_seconds"][0],
    }


def trl(model_dir: Path, where: Any, s: GpuSettings, scratch: Path, rollforge: dict[str, Any]) -> dict[str, Any]:
    """The same GRPO steps with TRL's ``GRPOTrainer``; ``ratio_step_time`` against ``rollforge``'s
    section (None when that one did not run)."""
    from ...errors import require
    from ..vs_trl import side_summary
    from ..vs_trl.trl_side import run_trl
    from ..vs_trl.workloads import arithmetic

    require("trl", extra="bench-trl", feature="the TRL section of bench gpu")
    run = run_trl(arithmetic(model_dir, seed=s.seed), _settings(where, s), scratch / "trl")
    summary = side_summary([run])
    ours = rollforge.get("seconds_per_step") if rollforge.get("status") == "ok" else None
    return {
        "seconds_per_step": summary["seconds_per_step"],
        "split_seconds": summary["phases_seconds_per_step"],
        "generated_tokens_per_step": summary["generated_tokens_per_step"],
        "ratio_step_time": round(ours / summary["seconds_per_step"], 4) if ours else None,
        "step_seconds": summary["step_seconds"][0],
    }


def train_throughput(model_dir: Path, where: Any, s: GpuSettings) -> dict[str, Any]:
    """``bench train-throughput`` at one pack of ``pack_tokens`` per step, bfloat16 autocast."""
    from .. import train_throughput as bench

    result = bench.run(
        str(model_dir),
        bench.Workload(batch=1, seq_len=s.pack_tokens, steps=s.pack_steps, warmup=1, seed=s.seed),
        device=str(where),
        dtype="bfloat16" if where.type == "cuda" else "float32",
    )
    keep = (
        "seq_len",
        "steps",
        "step_s",
        "step_s_min",
        "tokens_per_s",
        "flops_per_token",
        "achieved_flops_per_s",
        "peak_flops_per_s",
        "peak_source",
        "mfu",
        "dtype",
    )
    out = {k: result[k] for k in keep}
    out["anchor"] = "prime-rl's trainer benchmark: 11% MFU for Qwen3-0.6B on one H100; target >= 15%"
    if where.type == "cuda":
        import torch

        out["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(where) / 2**30, 2)
    return out


def fsdp2(model_dir: Path, where: Any, s: GpuSettings, scratch: Path) -> dict[str, Any]:
    """FSDP2 over a process group of one: updates, a checkpoint written and resumed."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        raise ConfigError("bench gpu's FSDP2 section needs its own process group; one is already initialised here")
    backend = "nccl" if where.type == "cuda" else "gloo"
    store = dist.FileStore(str(scratch / "process-group"), 1)
    options = {}
    if where.type == "cuda":  # "cuda" names no index, which set_device refuses
        options["device_id"] = torch.device("cuda", where.index or 0)
        torch.cuda.set_device(options["device_id"])
    dist.init_process_group(backend, store=store, rank=0, world_size=1, **options)
    try:
        return {
            "backend": backend,
            "world_size": dist.get_world_size(),
            **_fsdp_round_trip(model_dir, where, s, scratch),
        }
    finally:
        dist.destroy_process_group()


def _sharded(model_dir: Path, where: Any) -> tuple[Any, Any, Any, Any]:
    """``(model, tokenizer, optimizer, scheduler)``: the model of ``model_dir`` in float32 on
    ``where``, wrapped by FSDP2, with the trainer's AdamW and schedule."""
    from ...models import load_model
    from ...train.config import OptimConfig
    from ...train.distributed import fully_shard_model
    from ...train.policy import make_optimizer

    model, tokenizer = load_model(model_dir, device=where)
    model.requires_grad_(True)
    model = fully_shard_model(model)
    optimizer, scheduler = make_optimizer(model, OptimConfig(lr=1e-5, warmup_steps=0), optimizer_steps=100)
    return model, tokenizer, optimizer, scheduler


def _fsdp_round_trip(model_dir: Path, where: Any, s: GpuSettings, scratch: Path) -> dict[str, Any]:
    """Train and checkpoint a sharded model, then resume a fresh one from the checkpoint: its
    weights must be the ones written and its next update's loss the original's."""
    root = scratch / "checkpoints"
    trained = _train_and_save(model_dir, where, s, root)
    gc.collect()  # the trained model and its optimizer state are gone: one of each in memory at a time
    resumed = _resume_and_update(model_dir, where, s, root, trained["checkpoint"])
    expected, actual = trained.pop("next_loss"), resumed.pop("next_loss_resumed")
    return {
        "steps": s.fsdp_steps,
        "batch": s.fsdp_batch,
        "seq_len": s.fsdp_seq_len,
        **trained,
        **resumed,
        "next_loss": expected,
        "next_loss_resumed": actual,
        "next_loss_matches": abs(actual - expected) <= 1e-4 * max(1.0, abs(expected)),
    }


def _train_and_save(model_dir: Path, where: Any, s: GpuSettings, root: Path) -> dict[str, Any]:
    """``fsdp_steps`` timed updates of the sharded model, a checkpoint of it under ``root``, and the
    loss of the next update of the run that did not stop."""
    from ...models import load_model
    from ...train.checkpoint import save_checkpoint
    from ...train.distributed import is_sharded, refresh_copy
    from ...train.update import TrainedPolicy

    model, tokenizer, optimizer, scheduler = _sharded(model_dir, where)
    if not is_sharded(model):
        raise ConfigError("FSDP2 did not wrap the model")
    step = _update_step(model, tokenizer, optimizer, where, s)
    times = []
    for _ in range(s.fsdp_steps):
        began = time.perf_counter()
        step()
        scheduler.step()
        times.append(time.perf_counter() - began)
    plain, _ = load_model(model_dir, device="cpu")  # the full weights that model/ is written from
    refresh_copy(plain, model)
    began = time.perf_counter()
    policy = TrainedPolicy(model, optimizer, scheduler)
    saved = save_checkpoint(root, s.fsdp_steps, policy, tokenizer, {}, keep=1, plain=plain)
    save_seconds = time.perf_counter() - began
    del plain
    return {
        "step_seconds": [round(t, 3) for t in times],
        "checkpoint": saved.name,
        "checkpoint_mib": round(sum(f.stat().st_size for f in saved.rglob("*") if f.is_file()) / 2**20, 1),
        "save_seconds": round(save_seconds, 2),
        "next_loss": float(step().loss),
    }


def _resume_and_update(model_dir: Path, where: Any, s: GpuSettings, root: Path, saved: str) -> dict[str, Any]:
    """A fresh sharded model and optimizer resumed from the newest checkpoint under ``root`` (the
    one named ``saved``, just written): whether its weights are the written ones, and the loss of its
    next update."""
    import torch

    from ...train.checkpoint import load_newest, restore
    from ...train.distributed import full_state_dict

    model, tokenizer, optimizer, scheduler = _sharded(model_dir, where)
    began = time.perf_counter()
    loaded, skipped = load_newest(root)
    if loaded is None:
        raise ConfigError(f"the checkpoint just written at {root / saved} does not load: {'; '.join(skipped)}")
    written = {k: v.clone() for k, v in loaded.weights.items()}  # restore turns loaded's tensors into DTensors
    restore(loaded, model, optimizer, scheduler)
    load_seconds = time.perf_counter() - began
    weights = full_state_dict(model)
    common = [k for k in written if k in weights]
    matches = bool(common) and all(torch.equal(weights[k].cpu(), written[k].to(weights[k].dtype)) for k in common)
    del written
    return {
        "load_seconds": round(load_seconds, 2),
        "resumed_step": loaded.step,
        "resumed_weights_match": matches,
        "next_loss_resumed": float(_update_step(model, tokenizer, optimizer, where, s)().loss),
    }


def _update_step(model: Any, tokenizer: Any, optimizer: Any, where: Any, s: GpuSettings) -> Any:
    """The section's update (``train_throughput.update_step``): ``fsdp_batch`` rows of ``fsdp_seq_len``
    random tokens, bfloat16 autocast on CUDA."""
    import torch

    from ..train_throughput import update_step

    compute = torch.bfloat16 if where.type == "cuda" else torch.float32
    return update_step(model, optimizer, tokenizer.pad_token_id, where, compute, s.fsdp_batch, s.fsdp_seq_len, s.seed)


def scratch_dir(parent: str | None) -> Any:
    """A temporary directory for the run's models and checkpoints (under ``parent`` when given:
    a 1B model with its optimizer state needs some 20 GB)."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix="rollforge-bench-gpu-", dir=parent)
