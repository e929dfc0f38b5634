"""Checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a directory ``checkpoints/step-NNNNNN/`` holding

- ``model/``: ``save_pretrained`` output (the full model with its tokenizer, or only the LoRA
  adapter), loadable by ``rollforge eval --model``;
- ``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` (Python and torch generators);
- ``state.json``, written last: the step, the prompt source position and the size of every other
  file (a manifest, so that a truncated file is found without unpickling it).

Writing: under a temporary name ``.step-NNNNNN.tmp-PID``, renamed into place, then
``checkpoints/latest`` (a one-line file naming it) is replaced atomically; older checkpoints beyond
``keep`` are deleted after the new one is in place. A run killed at any instant leaves the previous
checkpoint or the new one, and at worst an orphan temporary directory, which the next run deletes.

Resuming (``load_newest``) trusts no single file: it tries the ``step-*`` directories newest first,
reads each one completely into memory and checks it against its manifest before touching the live
model, and returns the newest one that reads cleanly together with what it skipped and why (a
``latest`` pointer naming a missing directory, a missing ``state.json``, a truncated weights or
optimizer file). Applying it (``restore``) then cannot fail half-way for a damaged file.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, ConfigError

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
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng: dict[str, Any]


def save_checkpoint(
    root: Path, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
    data_state: dict[str, int], keep: int,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    remove_orphans(root)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp-{os.getpid()}"
    tmp.mkdir()
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, tmp / "rng.pt")
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / "state.json").write_text(json.dumps({"step": step, "data": data_state, "files": files}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, root / "latest")
    older = [p for p in _step_dirs(root) if _step_of(p) < step]
    for old in older[keep - 1:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def remove_orphans(root: Path) -> list[str]:
    """Delete temporary checkpoint directories left by killed runs; return their names."""
    removed = []
    if root.is_dir():
        for path in root.iterdir():
            if path.is_dir() and _TMP_DIR.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
    (root / ".latest.tmp").unlink(missing_ok=True)
    return removed


def latest_checkpoint(root: Path) -> Path | None:
    """The directory the ``latest`` pointer names, when it exists and has its ``state.json``."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def load_newest(root: Path) -> tuple[Loaded | None, list[str]]:
    """The newest checkpoint under ``root`` that reads completely, and one line per checkpoint
    skipped on the way (newest first) saying why."""
    skipped = []
    pointer = root / "latest"
    if pointer.is_file():
        named = pointer.read_text().strip()
        if not (root / named).is_dir():
            skipped.append(f"'latest' names {named!r}, which does not exist")
    for path in _step_dirs(root):
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
        optimizer, scheduler, rng = (
            torch.load(path / name, weights_only=False) for name in ("optimizer.pt", "scheduler.pt", "rng.pt")
        )
    except Exception as exc:  # safetensors, zipfile and pickle each raise their own kind for a damaged file
        raise CheckpointError(f"{path.name} cannot be read: {type(exc).__name__}: {exc}") from None
    return Loaded(path, step, data_state, weights, adapter, optimizer, scheduler, rng)


def restore(loaded: Loaded, model: Any, optimizer: Any, scheduler: Any) -> None:
    """Put a loaded checkpoint into the live model, optimizer, scheduler and RNGs."""
    if loaded.adapter:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, loaded.weights)
    else:
        missing, unexpected = model.load_state_dict(loaded.weights, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or ())
        if unexpected or set(missing) - tied:
            raise ConfigError(
                f"checkpoint {str(loaded.path)!r} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
    optimizer.load_state_dict(loaded.optimizer)
    scheduler.load_state_dict(loaded.scheduler)
    random.setstate(loaded.rng["python"])
    torch.set_rng_state(loaded.rng["torch"])


def _step_dirs(root: Path) -> list[Path]:
    """``step-*`` directories, newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.fullmatch(p.name)]
    return sorted(found, key=_step_of, reverse=True)


def _step_of(path: Path) -> int:
    return int(_STEP_DIR.fullmatch(path.name).group(1))
