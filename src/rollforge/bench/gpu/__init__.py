"""``rollforge bench gpu``: does every GPU path work on this machine, and how fast (one JSON report).

Made for an air-gapped GPU box: nothing is downloaded. Each model (``--models``: random-initialised
Qwen2.5-0.5B, Qwen3-0.6B and Llama-3.2-1B from the configs in ``gpu/models/``, see
``gpu.sections``) runs five sections, in this order:

- ``generation`` (``gpu.generation``): the same sampled requests through each way of generating
  (rollforge's engine, transformers' continuous batching with and without CUDA graphs, a compiled
  static cache): tokens/s, ms per decode step and ``floor_fraction`` against the memory floor;
- ``grpo``: rollforge GRPO steps, HF backend generating from the trained model: seconds per step
  split into rollout, update and sync; generation and update tokens/s; the update's MFU;
- ``trl``: the same steps with TRL's ``GRPOTrainer``; ``ratio_step_time`` = rollforge / TRL;
- ``fsdp2``: FSDP2 over a process group of one (NCCL; gloo on CPU), a checkpoint written and resumed;
- ``train_throughput``: ``bench train-throughput`` at 16,384-token packs: MFU (needs CUDA).

Then, once per run, not per model: ``vision`` (``gpu.vision``): a random-initialised SmolVLM-256M
(Idefics3) generating episodes with a new picture every turn through ``HFVisionBackend``, then one
GRPO update on them with their pictures. Never run on a GPU yet (only ``--quick``, on a CPU).

The boundary: every section runs inside ``_section``; whatever it raises becomes
``{"status": "failed", "reason": "<one line>"}`` and the run goes on (a failed model build fails
that model's sections). A section that needs CUDA on a machine without it is
``{"status": "skipped", "reason": "no CUDA device"}``; one that would start after ``--budget-s``
seconds is skipped saying so. The report is rewritten after every section, so an interrupted run
leaves what it measured.

Sizes (full run; about 4-5 minutes a model on one H100, so <= 20 minutes for the three): GRPO 8
prompts x 8 completions of 256 new tokens, 4 steps of which the first is an untimed warm-up, on
the ``arithmetic`` prompts; FSDP2 2 updates of 4 x 2,048 random tokens, then the round trip; packs
3 timed steps after 1 warm-up; vision 8 episodes x 3 turns of 64 tokens, each turn a new picture
(1,088 tokens: 16 tiles and the global view). ``--quick`` runs a 0.1M-parameter Qwen3-architecture
model (``tiny``) and the tests' tiny Idefics3 at a few tokens, in seconds on a CPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from . import generation, sections, vision
from .settings import FULL, QUICK, GpuSettings

#: name -> the section, in the order they run: (model_dir, where, settings, scratch, the model's
#: entry so far: ``trl`` reads ``grpo``'s) -> its figures. Each entry looks its ``gpu.sections``
#: function up when called, so a replaced one (a test's failing section) is the one that runs.
SECTION_RUNS: dict[str, Callable[[Path, Any, GpuSettings, Path, dict[str, Any]], dict[str, Any]]] = {
    "generation": lambda model_dir, where, s, scratch, entry: generation.run(model_dir, where, s),
    "grpo": lambda model_dir, where, s, scratch, entry: sections.grpo(model_dir, where, s, scratch),
    "trl": lambda model_dir, where, s, scratch, entry: sections.trl(
        model_dir, where, s, scratch, entry.get("grpo", {})
    ),
    "fsdp2": lambda model_dir, where, s, scratch, entry: sections.fsdp2(model_dir, where, s, scratch),
    "train_throughput": lambda model_dir, where, s, scratch, entry: sections.train_throughput(model_dir, where, s),
}
SECTIONS = tuple(SECTION_RUNS)
#: Sections that run once per run, after every model's: the vision-language model is its own.
RUN_SECTIONS = ("vision",)
NEEDS_CUDA = frozenset({"train_throughput"})


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated, of {', '.join(sections.MODELS)} (default: all three; tiny with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model at a few tokens (seconds, on a CPU)")
    parser.add_argument(
        "--full", action="store_true", help="the full sizes even without CUDA (else a CPU machine runs --quick)"
    )
    every = (*SECTIONS, *RUN_SECTIONS)
    parser.add_argument("--sections", default=",".join(every), help=f"comma-separated subset of {', '.join(every)}")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--out", default="gpu-report.json", help="the JSON report (default gpu-report.json)")
    parser.add_argument(
        "--scratch", default=None, help="where models and checkpoints go meanwhile (default: the temp dir)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=1200.0, help="skip sections that would start later (default 1200)"
    )
    parser.add_argument("--seed", type=int, default=0)


def main(args: Any) -> dict[str, Any]:
    from ...models import resolve_device

    if args.quick and args.full:
        raise ConfigError("--quick and --full contradict each other; give one")
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    every = (*SECTIONS, *RUN_SECTIONS)
    unknown = sorted(set(chosen) - set(every))
    if unknown or not chosen:
        raise ConfigError(f"--sections must name some of {', '.join(every)}, got {args.sections!r}")
    if args.budget_s <= 0:
        raise ConfigError(f"--budget-s must be > 0 seconds, got {args.budget_s}")
    named = [m.strip() for m in (args.models or "").split(",") if m.strip()]
    for name in named:
        sections.model_spec(name)  # an unknown name fails here, before anything runs
    if not args.quick and not args.full and resolve_device(args.device).type != "cuda":
        print(
            "rollforge bench gpu: no CUDA device here, so the quick form runs (--full: the full sizes)", file=sys.stderr
        )
        args.quick = True
    models = named if args.models else (["tiny"] if args.quick else list(sections.MODELS))
    settings = dataclasses.replace(QUICK if args.quick else FULL, seed=args.seed)
    # Before CUDA's allocator starts: 16k-token packs of a 1B model ran out of memory on an H100
    # with 3.2 GiB reserved in fragments (2026-11-26). Growable segments leave none.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    report = run(
        models,
        tuple(s for s in every if s in chosen),
        settings,
        args.device,
        Path(args.out),
        args.scratch,
        args.budget_s,
    )
    return summary(report, args.out)


def run(
    models: list[str],
    chosen: tuple[str, ...],
    settings: GpuSettings,
    device: str,
    out: Path,
    scratch: str | None,
    budget_s: float,
) -> dict[str, Any]:
    """Every section of every model, then the run's own (``vision``); the report (also written to
    ``out`` after each section)."""
    from ...models import resolve_device

    where = resolve_device(device)
    began = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "gpu",
        "environment": environment(where),
        "settings": dataclasses.asdict(settings),
        "budget_s": budget_s,
        "models": {},
        "notes": NOTES,
    }
    per_model = tuple(s for s in chosen if s in SECTION_RUNS)
    with sections.scratch_dir(scratch) as folder:
        for name in models if per_model else ():
            entry: dict[str, Any] = {}
            report["models"][name] = entry
            model_dir = Path(folder) / name
            entry["model"] = _section(partial(sections.build_model_dir, name, model_dir, where, settings.seed))
            for section in per_model:
                scratch_of = Path(folder) / f"{name}-{section}"
                entry[section] = _gated(
                    section,
                    entry,
                    where,
                    began,
                    budget_s,
                    partial(_call, section, model_dir, where, settings, scratch_of, entry),
                )
                shutil.rmtree(scratch_of, ignore_errors=True)  # a 1B model's checkpoint is some 15 GB
                report["seconds"] = round(time.perf_counter() - began, 1)
                _write(out, report)
            shutil.rmtree(model_dir, ignore_errors=True)
        if "vision" in chosen:
            scratch_of = Path(folder) / "vision"
            scratch_of.mkdir()
            report["vision"] = _over_budget(began, budget_s) or _section(
                partial(vision.run, where, settings, scratch_of)
            )
    report["seconds"] = round(time.perf_counter() - began, 1)
    _write(out, report)
    return report


def _call(
    section: str, model_dir: Path, where: Any, s: GpuSettings, scratch: Path, entry: dict[str, Any]
) -> dict[str, Any]:
    scratch.mkdir(parents=True, exist_ok=True)
    return SECTION_RUNS[section](model_dir, where, s, scratch, entry)


def _gated(
    section: str, entry: dict[str, Any], where: Any, began: float, budget_s: float, body: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``body`` at the boundary, unless the section cannot run here (no CUDA, no model, no time)."""
    if section in NEEDS_CUDA and where.type != "cuda":
        return {"status": "skipped", "reason": "no CUDA device"}
    if entry["model"]["status"] != "ok":
        return {"status": "skipped", "reason": "the model was not built (see its 'model' entry)"}
    return _over_budget(began, budget_s) or _section(body)


def _over_budget(began: float, budget_s: float) -> dict[str, Any] | None:
    """A skipped section's entry once ``budget_s`` seconds have passed since ``began``, else None."""
    spent = time.perf_counter() - began
    if spent > budget_s:
        return {"status": "skipped", "reason": f"the time budget of {budget_s:.0f} s was spent ({spent:.0f} s)"}
    return None


def _section(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The boundary: ``body``'s figures as ``{"status": "ok", "seconds": ..., ...}``, or what it
    raised as one line; device memory is released after either."""
    began = time.perf_counter()
    try:
        result = {"status": "ok", **body()}
    except Exception as exc:  # the boundary of a section: any failure is the report's, not the run's
        result = sections.failed(exc)
    finally:
        sections.release_memory()
    result["seconds"] = round(time.perf_counter() - began, 2)
    return result


def environment(where: Any) -> dict[str, Any]:
    """What ran the benchmark: versions, the device and its bfloat16 peak."""
    from importlib import metadata

    import torch

    from ..train_throughput import peak_flops

    def version(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    cuda = where.type == "cuda"
    peak, source = peak_flops(where, torch.bfloat16)
    return {
        "device": str(where),
        "device_name": torch.cuda.get_device_name(where) if cuda else platform.processor() or "cpu",
        "gpus": torch.cuda.device_count() if cuda else 0,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "accelerate": version("accelerate"),
        "trl": version("trl"),
        "rollforge": version("rollforge"),
        "peak_bf16_flops_per_s": peak,
        "peak_source": source,
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }


NOTES = [
    (
        "models are random-initialised from the published configs (gpu/models/*.json) with their own vocabulary; the "
        "tokenizer is rollforge.testing's 640-id BPE padded with placeholder tokens to that vocabulary; a random model "
        "almost never ends a turn, so completions run to the token limit"
    ),
    (
        "MFU: model FLOPs (6N + 12 L d_attn T per trained token, see bench train-throughput) over the bf16 dense peak "
        "of the detected GPU; null on a CPU or an unknown GPU. grpo's update MFU takes T = the first prompt's tokens + "
        "the mean completion (an estimate: prompts differ by a few tokens, and a group's shared prompt runs once)"
    ),
    (
        "grpo/trl: float32 master weights, bfloat16 autocast on CUDA (float32 on CPU); TRL's generation runs as its "
        "Trainer runs it; the first step of each is an untimed warm-up"
    ),
    (
        "grpo split: rollout = generation, rewards and advantages; update = the policy update; sync = the rest of the "
        "step (weight sync: nothing to copy, the HF backend generates from the trained model)"
    ),
]


def summary(report: dict[str, Any], out: str) -> dict[str, Any]:
    """The printed summary: per model and section its status and headline figure."""
    headline = {
        "generation": "fastest",
        "grpo": "seconds_per_step",
        "trl": "ratio_step_time",
        "fsdp2": "next_loss_matches",
        "train_throughput": "mfu",
        "model": "parameters",
    }
    models = {}
    for name, entry in report["models"].items():
        models[name] = {
            section: f"ok {headline[section]}={result.get(headline[section])}"
            if result["status"] == "ok"
            else f"{result['status']}: {result['reason']}"
            for section, result in entry.items()
        }
    env = report["environment"]
    printed = {
        "report": str(out),
        "device": f"{env['device']} ({env['device_name']})",
        "seconds": report["seconds"],
        "models": models,
    }
    if "vision" in report:
        printed["vision"] = _vision_line(report["vision"])
    return printed


def _vision_line(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"{result['status']}: {result['reason']}"
    generation, update = result["generation"], result["update"]
    return (
        f"ok {result['model']} generation_tokens_per_s={generation['generation_tokens_per_s']} "
        f"update_seconds={update['seconds']} peak_memory_gib={generation['peak_memory_gib']} (generation), "
        f"{update['peak_memory_gib']} (update)"
    )


def _write(out: Path, report: dict[str, Any]) -> None:
    from ...files import atomic_write

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(report, indent=2) + "\n")
