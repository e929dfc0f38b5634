"""Checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a directory ``checkpoints/step-NNNNNN/`` holding

- ``model/``: ``save_pretrained`` output (the full model with its tokenizer, or only the LoRA
  adapter), loadable by ``rollforge eval --model``; an image-text model's processor is saved in
  the tokenizer's place (its tokenizer and image settings), so the directory loads back as the same
  vision-language model with the same image expansion;
- ``optimizer/``: the optimizer state in ``torch.distributed.checkpoint``'s sharded format, each
  rank writing its shard; it loads into any number of ranks (one included), so a run resumes at
  another world size;
- ``scheduler.pt``, ``rng.pt`` (Python and torch generators, rank 0's);
- ``state.json``, written last: the step, the prompt source position and the size of every other
  file (a manifest, so that a truncated file is found without unpickling it).

Writing: under a temporary name ``.step-NNNNNN.tmp-PID``, renamed into place, then
``checkpoints/latest`` (a one-line file naming it) is replaced atomically; older checkpoints beyond
``keep`` are deleted after the new one is in place. A run killed at any instant leaves the previous
checkpoint or the new one, and at worst an orphan temporary directory, which the next run deletes.
A write that fails deletes its temporary directory; a full disk is one ``CheckpointError`` naming
the checkpoint (``logbook.out_of_space`` recognises it even where torch lost the errno).

Resuming (``load_newest``) trusts no single file: it tries the directory ``latest`` names, then
the older ``step-*`` directories newest first, reads each one completely into memory and checks it
against its manifest before touching the live model, and returns the first one that reads cleanly
together with what it skipped and why (a ``latest`` pointer naming a missing directory, a missing
``state.json``, a truncated weights or optimizer file, a directory newer than ``latest``). Applying
it (``restore``) then cannot fail half-way for a damaged file.

One run per directory: a run that starts at step 1 (``start_fresh``) refuses a directory that
holds one already, whose checkpoints, metrics and trajectories it would mix with its own; with
``overwrite`` it deletes that run's files (``RUN_FILES``) first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError
from ..files import atomic_write
from .distributed import Ranks, is_sharded, load_full_state_dict
from .logbook import out_of_space, read_metrics
from .update import TrainedPolicy

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step-(\d{6,})")
_TMP_DIR = re.compile(r"\.step-\d+\.tmp-\d+")


@dataclass(frozen=True)
class Loaded:
    """A checkpoint read completely into memory (nothing applied yet)."""

    path: Path
    step: int
    data_state: dict[str, int]
    weights: dict[str, torch.Tensor]
    adapter: bool  # the weights are a LoRA adapter's
    optimizer: Path | dict[str, Any]  # the sharded optimizer/ directory (or an older optimizer.pt's state)
    scheduler: dict[str, Any]
    rng: dict[str, Any]


def save_checkpoint(
    root: Path,
    step: int,
    policy: TrainedPolicy,
    tokenizer: Any,
    data_state: dict[str, int],
    keep: int,
    *,
    plain: Any = None,
) -> Path:
    """Write checkpoint ``step`` of ``policy`` (its model, optimizer and schedule; every rank calls
    it: the optimizer state is written by each rank for its shard). ``tokenizer``: the model's, or
    an image-text model's processor (which saves its tokenizer too). ``plain``: a model holding the
    full weights, written as ``model/`` (default ``policy.model``; a sharded policy passes its
    gathered generation copy)."""
    model, optimizer, scheduler, ranks = policy.model, policy.optimizer, policy.scheduler, policy.ranks
    plain = model if plain is None else plain
    final = root / f"step-{step:06d}"
    tmp = ranks.broadcast(root / f".step-{step:06d}.tmp-{os.getpid()}")  # rank 0's name for every rank
    try:
        _write(tmp, final, step, model, tokenizer, optimizer, scheduler, data_state, ranks, plain)
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        full = out_of_space(exc, root)  # before the partial files are deleted
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise CheckpointError(
                f"cannot write checkpoint {str(final)!r}: no space left on device; the checkpoints before it are "
                f"intact: free space, then continue with --resume"
            ) from None
        raise
    if ranks.main:
        older = [p for p in _step_dirs(root) if step_of(p) < step]
        for old in older[keep - 1 :]:
            shutil.rmtree(old, ignore_errors=True)
    ranks.barrier()
    return final


def _write(
    tmp: Path,
    final: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    data_state: dict[str, int],
    ranks: Ranks,
    plain: Any,
) -> None:
    """Every file of the checkpoint under ``tmp``, then (rank 0) renamed to ``final`` and named by
    ``latest``."""
    root = final.parent
    with ranks.together(f"writing checkpoint {str(final)!r}"):
        if ranks.main:
            root.mkdir(parents=True, exist_ok=True)
            remove_orphans(root)
            tmp.mkdir()
            plain.save_pretrained(tmp / "model")
            tokenizer.save_pretrained(tmp / "model")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, tmp / "rng.pt")
    _dcp_save(optimizer_state(model, optimizer), tmp / "optimizer", alone=not ranks.distributed)
    with ranks.together(f"writing checkpoint {str(final)!r}"):
        if ranks.main:
            files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            (tmp / "state.json").write_text(json.dumps({"step": step, "data": data_state, "files": files}))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            atomic_write(root / "latest", final.name + "\n")


def optimizer_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The optimizer's state keyed by parameter name, each rank holding its shard (the form
    ``torch.distributed.checkpoint`` reshards on load, to any number of ranks)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer)


@contextlib.contextmanager
def _single_process_is_fine():
    """DCP warns when there is no process group; one process is the intended single-rank case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _dcp_save(state: dict[str, Any], directory: Path, alone: bool) -> None:
    """``alone``: one process holds the whole state; DCP then touches no process group, whatever
    group another library (an in-process vLLM engine) created, left behind or tears down meanwhile."""
    import torch.distributed.checkpoint as dcp

    with _single_process_is_fine():
        dcp.save({"optimizer": state}, checkpoint_id=directory, no_dist=alone)


def remove_orphans(root: Path) -> list[str]:
    """Delete temporary checkpoint directories left by killed runs; return their names."""
    removed = []
    if root.is_dir():
        for path in root.iterdir():
            if path.is_dir() and _TMP_DIR.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
    (root / "latest.tmp").unlink(missing_ok=True)  # atomic_write's temporary
    return removed


def latest_checkpoint(root: Path) -> Path | None:
    """The directory the ``latest`` pointer names, when it exists and has its ``state.json``."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load_newest(root: Path) -> tuple[Loaded | None, list[str]]:
    """The checkpoint to resume from under ``root``: the one ``latest`` names or, when it does not
    read completely, the newest older one that does; and one line per checkpoint skipped on the way
    (newest first) saying why."""
    skipped = []
    candidates = _step_dirs(root)
    pointer = root / "latest"
    if pointer.is_file():
        named = pointer.read_text().strip()
        if not (_STEP_DIR.fullmatch(named) and (root / named).is_dir()):
            skipped.append(f"'latest' names {named!r}, which does not exist")
        else:  # 'latest' first: a newer directory is another run's, or was never named (the run was killed)
            newer = [p for p in candidates if step_of(p) > step_of(root / named)]
            skipped += [f"{p.name} is newer than the {named} that 'latest' names" for p in newer]
            candidates = candidates[len(newer) :]
    for path in candidates:
        try:
            return read_checkpoint(path), skipped
        except CheckpointError as exc:
            skipped.append(str(exc))
    return None, skipped


def read_checkpoint(path: Path) -> Loaded:
    """Read and check every file of one checkpoint; ``CheckpointError`` names the first damage."""
    from safetensors.torch import load_file

    state_file = path / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{path.name} has no state.json (it was never completed)")
    try:
        state = json.loads(state_file.read_text())
        step, data_state = int(state["step"]), dict(state["data"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path.name}/state.json is unreadable ({exc})") from None
    for name, size in state.get("files", {}).items():  # checkpoints written before the manifest have none
        file = path / name
        actual = file.stat().st_size if file.is_file() else None
        if actual != size:
            found = "missing" if actual is None else f"{actual} bytes"
            raise CheckpointError(f"{path.name}/{name} is {found}, expected {size} bytes (truncated or damaged)")
    model_dir = path / "model"
    adapter = (model_dir / "adapter_model.safetensors").is_file()
    files = [model_dir / "adapter_model.safetensors"] if adapter else sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path.name} has no model weights under model/")
    weights: dict[str, torch.Tensor] = {}
    try:
        for file in files:
            weights.update(load_file(file))
        scheduler, rng = (torch.load(path / name, weights_only=False) for name in ("scheduler.pt", "rng.pt"))
        optimizer = path / "optimizer"
        if (optimizer / ".metadata").is_file():
            from torch.distributed.checkpoint import FileSystemReader

            FileSystemReader(optimizer).read_metadata()  # the shards' sizes are checked by the manifest
        else:
            optimizer = torch.load(path / "optimizer.pt", weights_only=False)
    except Exception as exc:  # safetensors, zipfile and pickle each raise their own kind for a damaged file
        raise CheckpointError(f"{path.name} cannot be read: {type(exc).__name__}: {exc}") from None
    return Loaded(path, step, data_state, weights, adapter, optimizer, scheduler, rng)


def restore(loaded: Loaded, model: Any, optimizer: Any, scheduler: Any) -> None:
    """Put a loaded checkpoint into the live model (sharded or not), optimizer, scheduler and RNGs.
    The optimizer state is resharded to this run's ranks, whatever the saving run's number was."""
    if loaded.adapter:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, loaded.weights)
    else:
        names = set(model.state_dict())  # a sharded model's names are the full model's
        tied = set(getattr(model, "_tied_weights_keys", None) or ())
        missing, unexpected = names - set(loaded.weights), set(loaded.weights) - names
        if unexpected or missing - tied:
            raise ConfigError(
                f"checkpoint {str(loaded.path)!r} does not fit the model: missing {sorted(missing - tied)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        load_full_state_dict(model, loaded.weights)
    if isinstance(loaded.optimizer, Path):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        state = optimizer_state(model, optimizer)
        _dcp_load(state, loaded.optimizer, loaded.path, alone=not is_sharded(model))
        set_optimizer_state_dict(model, optimizer, state)
    else:  # optimizer.pt of checkpoints written before the sharded format
        optimizer.load_state_dict(loaded.optimizer)
    scheduler.load_state_dict(loaded.scheduler)
    random.setstate(loaded.rng["python"])
    torch.set_rng_state(loaded.rng["torch"])


def _dcp_load(state: dict[str, Any], directory: Path, checkpoint: Path, alone: bool) -> None:
    """``alone``: the model is not sharded, so every process reads the whole state by itself."""
    import torch.distributed.checkpoint as dcp

    try:
        with _single_process_is_fine():
            dcp.load({"optimizer": state}, checkpoint_id=directory, no_dist=alone)
    except Exception as exc:  # DCP raises its own kinds (CheckpointException, RuntimeError) for damaged files
        raise CheckpointError(f"{checkpoint.name}/optimizer cannot be read: {type(exc).__name__}: {exc}") from None


def _step_dirs(root: Path) -> list[Path]:
    """``step-*`` directories, newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name)]
    return sorted(found, key=step_of, reverse=True)


def step_of(path: Path) -> int:
    """The step of a checkpoint directory ``step-NNNNNN``."""
    return int(_STEP_DIR.fullmatch(path.name).group(1))


def resumable(out: Path) -> Loaded | None:
    """The checkpoint to continue from (``load_newest``, warning about the ones skipped), or None
    for a run that has recorded nothing yet. A run with history but no
    usable checkpoint is an error: starting over would replace its metrics."""
    _check_directory(out)
    root = out / "checkpoints"
    for name in remove_orphans(root):
        logger.warning("deleted %s, a checkpoint that a killed run left unfinished", root / name)
    loaded, skipped = load_newest(root)
    if loaded is None:
        recorded = [m.get("step", 0) for m in read_metrics(out / "metrics.jsonl")]
        if not skipped and not recorded:
            return None
        why = f" (skipped: {'; '.join(skipped)})" if skipped else ""
        history = f"; metrics.jsonl records steps up to {max(recorded)}" if recorded else ""
        raise CheckpointError(
            f"cannot resume {str(out)!r}: no usable checkpoint under {str(root)!r}{why}{history}; "
            f"to start over, choose another out or delete {str(out)!r}"
        )
    if skipped:
        logger.warning("resuming from %s after skipping: %s", loaded.path, "; ".join(skipped))
    return loaded


#: What runs write in their directory, and all that ``overwrite`` deletes: the files of ``train``
#: and ``sft``, the quickstart's report and its warm-up run.
RUN_FILES = (
    "metrics.jsonl",
    "checkpoints",
    "trajectories",
    "tensorboard",
    "config.yaml",
    "eval.json",
    "report.md",
    "reward_curve.png",
    "held_out_curve.png",
    "loss_curve.png",
    "warmup",
)


def start_fresh(out: Path, overwrite: bool, *, can_resume: bool = True) -> None:
    """Ready ``out`` for a run that starts at step 1. A directory that holds a run already is
    refused, so that two runs never mix in one (interleaved metrics, trajectories and checkpoints);
    with ``overwrite``, that run's ``RUN_FILES`` are deleted first."""
    _check_directory(out)
    found = recorded(out)
    if found is None:
        return
    if not overwrite:
        resume = "continue it with --resume, or " if can_resume else ""
        raise ConfigError(
            f"out {str(out)!r} already holds a run ({found}); {resume}start over with --overwrite (deletes it) "
            f"or another out"
        )
    for name in RUN_FILES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # every rank clears, before they meet
        else:
            path.unlink(missing_ok=True)
    logger.warning("deleted the run in %s (%s) to start over", out, found)


def recorded(out: Path) -> str | None:
    """What shows that ``out`` holds a run, or None: recorded metrics, a checkpoint or trajectories.
    (A ``config.yaml`` or ``eval.json`` alone is no run: one stopped before its first step, or the
    quickstart's base evaluation.)"""
    steps = [m.get("step", 0) for m in read_metrics(out / "metrics.jsonl")]
    if steps:
        return f"metrics.jsonl records steps up to {max(steps)}"
    if checkpoints := _step_dirs(out / "checkpoints"):
        return f"checkpoint {checkpoints[0].name}"
    if trajectories := sorted((out / "trajectories").glob("step-*.jsonl")):
        return f"trajectories up to {trajectories[-1].name}"
    return None


def _check_directory(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {str(out)!r} is a file; expected a run directory")
