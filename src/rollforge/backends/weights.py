"""Exporting a trainer's weights for an engine that runs in another process (vLLM, a served model).

The hand-over is a directory holding one ``model.safetensors`` with Hugging Face parameter names,
which vLLM reloads in place (its worker method ``reload_weights(weights_path=...)``, reachable
in-process through ``AsyncLLM.collective_rpc`` and on a server through the dev-mode
``/collective_rpc`` endpoint). A file, not tensors over the engine's RPC channel: vLLM's RPC
decodes untyped arguments without rebuilding tensors, and a file under ``/dev/shm`` costs one
memory copy. The directory must be readable by the engine, so a remote server needs a shared
filesystem.

- Tied parameters (``lm_head.weight`` sharing the embedding's storage) are written once; vLLM ties
  them again on load.
- A peft model is merged (base + scaled LoRA delta) on a copy, so the trainer's model keeps its
  adapter; the merged weights carry the base model's names.
"""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import atomic_write

WEIGHTS_FILE = "model.safetensors"


def is_peft_model(model: Any) -> bool:
    """A peft ``PeftModel`` (duck-typed: peft is an optional dependency)."""
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def merged_model(model: Any) -> Any:
    """The model to export: a merged copy of a peft model, else the model itself."""
    if is_peft_model(model):
        return copy.deepcopy(model).merge_and_unload()
    return model


def state_dict_for_export(model: Any) -> dict[str, Any]:
    """Parameters and buffers by Hugging Face name, each storage once, contiguous, on the CPU."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"update_weights needs a torch.nn.Module (a transformers or peft model), got {type(model).__name__}"
        )
    seen: set[tuple[int, int]] = set()
    out: dict[str, Any] = {}
    for name, tensor in merged_model(model).state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:  # a tied weight: the engine re-ties it
            continue
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def export_weights(model: Any, directory: Path) -> Path:
    """Write ``model``'s weights to ``directory/model.safetensors`` (atomically) and return the directory."""
    return save_state_dict(state_dict_for_export(model), directory)


def save_state_dict(state: dict[str, Any], directory: Path) -> Path:
    """Write a ``state_dict_for_export`` result to ``directory/model.safetensors`` (atomically)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp)))
    return directory


def scratch_directory(prefix: str) -> Path:
    """A fresh directory in shared memory when the machine has it (no disk write), else in the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
