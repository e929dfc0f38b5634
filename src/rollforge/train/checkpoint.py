"""Checkpoints: everything a run needs to continue as if it had never stopped.

A checkpoint is a directory ``checkpoints/step-NNNNNN/`` holding

- ``model/``: ``save_pretrained`` output (the full model with its tokenizer, or only the LoRA
  adapter), loadable by ``rollforge eval --model``;
- ``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` (Python and torch generators);
- ``state.json``: the step and the prompt source position.

It is written under a temporary name and renamed into place, and ``checkpoints/latest`` (a one-
line file naming it) is replaced atomically afterwards, so a run killed at any instant leaves
either the previous checkpoint or the new one, never a torn one. Older checkpoints beyond ``keep``
are deleted after the new one is in place.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError


@dataclass(frozen=True)
class Restored:
    step: int
    data_state: dict[str, int]


def save_checkpoint(
    root: Path, step: int, model: Any, tokenizer: Any, optimizer: Any, scheduler: Any,
    data_state: dict[str, int], keep: int,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save({"python": random.getstate(), "torch": torch.get_rng_state()}, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "data": data_state}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, root / "latest")
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def restore_checkpoint(path: Path, model: Any, optimizer: Any, scheduler: Any) -> Restored:
    """Load weights, optimizer, scheduler and RNG states from ``path`` into the live objects."""
    from safetensors.torch import load_file

    state = json.loads((path / "state.json").read_text())
    model_dir = path / "model"
    adapter = model_dir / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(adapter))
    else:
        weights: dict[str, torch.Tensor] = {}
        for file in sorted(model_dir.glob("*.safetensors")):
            weights.update(load_file(file))
        if not weights:
            raise ConfigError(f"checkpoint {str(path)!r} has no model weights under model/")
        missing, unexpected = model.load_state_dict(weights, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or ())
        if unexpected or set(missing) - tied:
            raise ConfigError(
                f"checkpoint {str(path)!r} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
    rng = torch.load(path / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    torch.set_rng_state(rng["torch"])
    return Restored(int(state["step"]), state["data"])
