"""The generation backend protocol: token ids in; token ids, logprobs and a finish reason out.

A backend knows nothing of environments or chat templates. It receives the full prompt of one
episode as token ids and returns the continuation exactly as sampled. Many episodes call
``generate`` concurrently; a backend is free to batch those calls (the HF backend batches them into
shared forward passes, vLLM streams them into its continuous batching).

Logprobs are those of the *unmodified* model distribution (``log_softmax`` of the logits, before
temperature, top-p or top-k), so that a forward pass of the same weights reproduces them and a
trainer can use them as the behaviour policy.

Stop conditions: generation ends at the first token in ``stop_token_ids`` (kept in the output), at
the first token whose text completes one of the ``stop`` strings (kept in the output, token-exact:
nothing is cut from inside a token), or after ``max_new_tokens`` (finish reason ``length``).

``Backend`` is a base class: everything the engine, the trainer and a router of replicas may ask of
a backend is declared on it with a default (``accepts_images``, ``shares_model``,
``invalidate_cache``, ``close``, ``syncs_weights``, ``supports_sleep`` with ``sleep``/``wake_up``,
``reopener``; a replica's ``name``, ``dead`` and ``share_weights``); only ``generate`` must be
written. Weight sync stays a separate optional protocol (``WeightSync``); ``syncs_weights`` says
whether a backend implements it.

A backend is an async context manager, like httpx's transports: ``async with backend:`` (or
``async with open_backend(config) as backend:``) closes it on the way out, error or not. Whoever
opens a backend closes it.

``BackendWrapper`` is a backend around another one, in the shape of Gymnasium's ``Wrapper``: it
forwards every member declared here and in ``WeightSync`` to the wrapped backend, so a wrapper
(weight versions, recording) overrides only what it changes. Closing a wrapper leaves the wrapped
backend open: whoever opened that closes it.
"""

from __future__ import annotations

import abc
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar, runtime_checkable

from ..errors import BackendError, ConfigError
from ..types import Completion


_B = TypeVar("_B", bound="Backend")

#: The episode a ``generate`` call comes from: the engine sets it in each episode's task to an object
#: that lives exactly as long as the episode (weak references work). A router of replicas keys its
#: sticky placement on it; backends may ignore it. None outside the engine.
CURRENT_EPISODE: ContextVar[object | None] = ContextVar("rollforge_current_episode", default=None)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Backend(abc.ABC):
    """A generation backend. ``generate`` is called concurrently by many episodes."""

    #: A backend for a vision-language model sets ``accepts_images = True`` and takes
    #: ``generate(prompt_ids, params, images=...)``, the conversation's images so far in order
    #: (``Message.images``: PIL images or encoded bytes). Text-only backends (the default): the
    #: engine refuses environments that declare ``produces_images`` before the rollout starts, and
    #: fails an episode that gets an image anyway.
    accepts_images: bool = False
    #: Why a backend that could take images does not (one line for the refusal), else None.
    images_missing: str | None = None
    #: How errors and a router's ``stats()`` call this backend (None: a router numbers its replicas).
    name: str | None = None
    #: Why this backend can serve no more requests (a Ray replica whose actor died), else None: a
    #: router places no new episodes on a dead replica.
    dead: str | None = None

    @abc.abstractmethod
    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Continue ``prompt_ids``; raise ``BackendError`` when the request fails."""

    async def close(self) -> None:
        """Release engines, threads and connections. Idempotent."""
        return None

    async def __aenter__(self: _B) -> _B:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def reopener(self) -> Callable[[], "Backend"] | None:
        """A picklable function that opens an equivalent backend in another process, for engine
        worker processes (``RolloutConfig.engine_workers``) to generate on their own; None (the
        default, and a wrapper's): their requests come to this backend instead."""
        return None

    def shares_model(self, model: Any) -> bool:
        """Whether this backend generates with ``model`` itself (the trainer's object), so that
        an optimizer step needs no weight sync, only ``invalidate_cache()``."""
        return False

    def invalidate_cache(self) -> None:
        """The shared model's weights changed in place: forget what was computed with the old ones."""
        return None

    @property
    def syncs_weights(self) -> bool:
        """Whether this backend implements the ``WeightSync`` protocol (``update_weights``)."""
        return isinstance(self, WeightSync)

    @staticmethod
    def share_weights(model: Any) -> Any:
        """What ``update_weights`` takes in place of ``model``, prepared once for every replica that
        has this same function (a router calls each distinct one once, off the event loop). A
        function of the model alone, declared per class (Ray replicas export the state dict and put
        it once in Ray's object store). The default: ``model`` itself."""
        return model

    @property
    def supports_sleep(self) -> bool:
        """Whether ``sleep``/``wake_up`` release and retake the backend's accelerator memory (a
        vLLM engine colocated with the trainer on one GPU). A sleeping backend refuses requests."""
        return False

    async def sleep(self) -> None:
        """Release the weights' and the KV cache's accelerator memory until ``wake_up``."""
        raise BackendError(f"{type(self).__name__} has no sleep mode")

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Take back what ``sleep`` released: ``tags`` among ``weights`` and ``kv_cache``
        (None: both). Requests are served again once both are awake."""
        raise BackendError(f"{type(self).__name__} has no sleep mode")


@runtime_checkable
class WeightSync(Protocol):
    """Optional protocol of a backend that does not share the trainer's model object (vLLM in-process,
    a served model). After each optimizer step the trainer calls ``update_weights(model)`` with its
    model (a transformers model, or a peft model: merged, or loaded as an adapter where the backend
    supports it); once it returns, every *new* request is generated with those weights. Requests in
    flight during the call finish first (on the old weights) and are not mixed with the new ones.
    A backend that cannot guarantee this raises ``BackendError`` rather than serve a stale policy.
    ``weight_version`` counts completed updates (0: the weights the backend started with).
    The HF backend needs no sync: it generates with the trainer's own model object.
    """

    weight_version: int

    async def update_weights(self, model: Any) -> None:
        """Make the backend generate with ``model``'s current weights; raise ``BackendError`` on failure."""
        ...


class BackendWrapper(Backend):
    """``inner`` as it is (see the module docstring); a subclass overrides what it changes."""

    def __init__(self, inner: Backend):
        if not isinstance(inner, Backend):
            raise ConfigError(f"{type(self).__name__} wraps a rollforge Backend, got {type(inner).__name__}")
        self.inner = inner

    @property
    def accepts_images(self) -> bool:  # type: ignore[override]
        return self.inner.accepts_images

    @property
    def images_missing(self) -> str | None:  # type: ignore[override]
        return self.inner.images_missing

    @property
    def name(self) -> str | None:  # type: ignore[override]
        return self.inner.name

    @property
    def dead(self) -> str | None:  # type: ignore[override]
        return self.inner.dead

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, **kwargs: Any) -> Completion:
        return await self.inner.generate(prompt_ids, params, **kwargs)

    async def close(self) -> None:
        """Nothing to release of its own; the wrapped backend belongs to whoever opened it."""
        return None

    def shares_model(self, model: Any) -> bool:
        return self.inner.shares_model(model)

    def invalidate_cache(self) -> None:
        self.inner.invalidate_cache()

    @property
    def syncs_weights(self) -> bool:
        return self.inner.syncs_weights

    @property
    def share_weights(self) -> Callable[[Any], Any]:  # type: ignore[override]
        """The wrapped backend's own function, so that wrapped replicas still share one export."""
        return self.inner.share_weights

    @property
    def weight_version(self) -> int:
        """The wrapped backend's; absent (``AttributeError``) when it has no weight sync."""
        return self.inner.weight_version  # type: ignore[attr-defined]

    async def update_weights(self, model: Any) -> None:
        if not self.inner.syncs_weights:
            raise BackendError(f"{type(self.inner).__name__} has no weight sync (update_weights)")
        await self.inner.update_weights(model)  # type: ignore[attr-defined]

    @property
    def supports_sleep(self) -> bool:
        return self.inner.supports_sleep

    async def sleep(self) -> None:
        await self.inner.sleep()

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self.inner.wake_up(tags)

    def reopener(self) -> Callable[[], Backend] | None:
        """None: a worker process reopening the wrapped backend would bypass what the wrapper adds
        (weight versions, recording), so workers send their requests through the wrapper."""
        return None


class StopStrings:
    """Detects stop strings in a growing list of generated token ids without decoding it all.

    ``completed_by_last(ids)`` is true when the text of ``ids`` contains a stop string that the last
    token completed. Only a window of trailing tokens long enough to hold any stop string is decoded.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str]):
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        # A token decodes to at least one character, except special/partial-byte tokens; the slack
        # of 8 covers those.
        self._window = max((len(s) for s in self._stop), default=0) + 8

    def __bool__(self) -> bool:
        return bool(self._stop)

    def completed_by_last(self, ids: Sequence[int]) -> bool:
        if not self._stop or not ids:
            return False
        window = ids[-self._window :]
        text = self._decode(window)
        if not any(s in text for s in self._stop):
            return False
        before = self._decode(window[:-1])
        return not any(s in before for s in self._stop)
