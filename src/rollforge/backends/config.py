"""``BackendConfig``: everything that says which generation backend to open, as one frozen value.

Training (``train/generation_backend.py`` builds it from the config sections it uses), ``rollforge
rollout``, ``rollforge eval``, ``rollforge gateway`` and SFT's rejection sampling all describe their
backend with it, so a bad choice fails the same way everywhere: constructing the value checks every
field and every combination (``base_url`` only with ``openai``, one replica per URL, ...) and raises
a one-line ``ConfigError`` naming the bad value and what was expected.

It is a frozen dataclass, not a pydantic section: it is built by code (CLI flags, sections of a
training config that pydantic already validated), never read from a file, so it needs none of the
YAML machinery; its cross-field rules read best as one ``__post_init__`` with messages written for
users, like ``SamplingParams`` beside it in ``backends/base.py``; and it travels to Ray actors
pickled as it is. ``options`` is copied on construction and must be treated as read-only.

Where the backend runs is decided above ``backends/``: ``backends.opening.open_backend`` opens it
in this process (``replicas == 1``, or several ``openai`` servers), ``cluster.generation
.open_generation`` also starts ``hf``/``vllm`` replicas on Ray actors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import ConfigError

BACKEND_KINDS = ("hf", "vllm", "openai")


@dataclass(frozen=True)
class BackendConfig:
    """Which backend generates, for which model, and how much it may do at once."""

    kind: str = "hf"
    """``hf`` (transformers in this process), ``vllm`` (vLLM in this process) or ``openai`` (a served
    model behind an OpenAI-compatible server)."""
    model: str = "smollm2-135m"
    """A local model directory, a cached hub id or an alias (``smollm2-135m``). With ``openai`` it
    names the tokenizer's model; the server must serve the same one."""
    base_url: str | tuple[str, ...] | None = None
    """``openai`` only (and required there): the server URL, a comma-separated string of URLs or a
    sequence of them (stored as a tuple). Several URLs give one backend per server behind a router."""
    served_model_name: str | None = None
    """``openai``: the server's model name (None: its only model)."""
    concurrency: int = 64
    """Requests in flight per replica (HF batch rows, vLLM running sequences, HTTP requests)."""
    seed: int | None = None
    """Seed of requests that carry none; replica ``i`` gets ``seed + i``."""
    request_timeout: float | None = None
    """Seconds one request may take (``vllm``, ``openai``; None: the backend's default)."""
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Extra fields of the chosen backend's settings (``HFSettings``, ``VLLMSettings``,
    ``OpenAICompatSettings`` in ``settings.py``), e.g. ``{"enable_lora": True}`` or ``{"weights_dir": ...}``."""
    replicas: int = 1
    """Generation replicas. ``openai``: 1 or the number of URLs. ``hf``/``vllm``: more than 1 runs
    that many Ray actors (``cluster.generation.open_generation``)."""
    replica_cpus: float | None = None
    """CPUs Ray reserves per replica actor (None: sized by ``cluster.resources``)."""
    replica_gpus: float = 0.0
    """GPUs Ray reserves per replica actor."""
    check_reachable: bool = False
    """``openai``: fail at open (``BackendError`` naming the URL) when a server does not answer,
    instead of failing every episode later. Commands set it."""

    def __post_init__(self) -> None:
        if self.kind not in BACKEND_KINDS:
            raise ConfigError(f"unknown backend {self.kind!r}: expected one of {', '.join(BACKEND_KINDS)}")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model must be a model directory, hub id or alias, got {self.model!r}")
        _check_int("concurrency", self.concurrency, 1)
        _check_int("replicas", self.replicas, 1)
        if self.seed is not None:
            _check_int("seed", self.seed, None)
        if self.request_timeout is not None and not _positive(self.request_timeout):
            raise ConfigError(f"request_timeout must be a number of seconds > 0 or None, got {self.request_timeout!r}")
        if self.replica_cpus is not None and not _non_negative(self.replica_cpus):
            raise ConfigError(f"replica_cpus must be a number >= 0 or None, got {self.replica_cpus!r}")
        if not _non_negative(self.replica_gpus):
            raise ConfigError(f"replica_gpus must be a number >= 0, got {self.replica_gpus!r}")
        if not isinstance(self.options, Mapping):
            raise ConfigError(f"options must be a mapping of backend constructor arguments, got {self.options!r}")
        object.__setattr__(self, "options", dict(self.options))
        if self.base_url is not None and self.kind != "openai":
            raise ConfigError(
                f"base_url is only used by the openai backend, not by {self.kind!r} (got {self.base_url!r})"
            )
        if self.kind == "openai":
            self._check_servers()

    def _check_servers(self) -> None:
        if self.base_url is None:
            raise ConfigError("the openai backend needs base_url (e.g. --base-url http://127.0.0.1:8000)")
        urls = server_urls(self.base_url)
        if not isinstance(self.base_url, str):
            object.__setattr__(self, "base_url", tuple(urls))
        if self.replicas not in (1, len(urls)):
            raise ConfigError(
                f"the openai backend has one replica per URL: replicas={self.replicas} but base_url names "
                f"{len(urls)} server(s) ({', '.join(urls)})"
            )

    @property
    def urls(self) -> list[str]:
        """The servers of the ``openai`` backend ([] for the others)."""
        return [] if self.base_url is None else server_urls(self.base_url)


def server_urls(base_url: str | Sequence[str]) -> list[str]:
    """The servers named by ``base_url``: one URL, a comma-separated string of them, or a list."""
    urls = [u.strip() for u in base_url.split(",")] if isinstance(base_url, str) else [str(u).strip() for u in base_url]
    if not urls or not all(urls):
        raise ConfigError(f"base_url must name one or more servers, comma-separated, got {base_url!r}")
    return urls


def _check_int(name: str, value: Any, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        expected = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(f"{name} must be {expected}, got {value!r}")


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def _non_negative(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0
