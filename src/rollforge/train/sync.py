"""Weight sync: after every update, the generation backend must serve the new policy before the
next rollout starts, or the run silently trains on stale samples.

A backend that generates with the trained model object itself (``Backend.shares_model``, e.g.
``HFBackend(model)``) only has to forget caches computed with the old weights
(``invalidate_cache()``). Any other backend must implement the optional ``WeightSync`` protocol
(``update_weights(model)``, see ``backends/base.py``; ``Backend.syncs_weights``); one that has
neither is rejected when training starts, not after a step.

A backend colocated with the trainer on one GPU (``Backend.supports_sleep``: vLLM in sleep mode,
``vllm.colocate``) gives its memory back for the update. The trainer calls ``release()`` right
before the update and ``push(model)`` right after it; the order on the backend is then::

    rollout -> sleep() -> update -> wake_up(["weights"]) -> update_weights(model) -> wake_up(["kv_cache"]) -> rollout

The weights wake first so that the new ones load into memory the engine owns again, before the KV
cache takes the rest; a request that reaches the sleeping backend fails (``BackendError``) instead
of waiting, since a rollout overlapping the update is a bug of the caller.
"""

from __future__ import annotations

from typing import Any

from ..backends.base import Backend
from ..errors import ConfigError


class PolicySync:
    def __init__(self, backend: Backend, model: Any):
        self.backend = backend
        self.shared = backend.shares_model(model)
        if not self.shared and not backend.syncs_weights:
            raise ConfigError(
                f"{type(backend).__name__} neither generates with the trained model object nor has "
                f"update_weights(model); it would keep serving the initial weights"
            )
        self.sleeps = backend.supports_sleep
        self.asleep = False
        self.syncs = 0

    async def release(self) -> None:
        """Before the update: a backend that can sleep releases its accelerator memory; for any
        other this does nothing."""
        if self.sleeps and not self.asleep:
            await self.backend.sleep()
            self.asleep = True

    async def push(self, model: Any) -> None:
        """After the update: the backend serves ``model``'s weights from its next request on
        (a released backend is woken: weights, then the new weights, then its KV cache)."""
        if self.shared:
            self.backend.invalidate_cache()  # caches computed with the old weights must not be reused
            return
        if self.asleep:
            await self.backend.wake_up(["weights"])
            await self.backend.update_weights(model)
            await self.backend.wake_up(["kv_cache"])
            self.asleep = False
        else:
            await self.backend.update_weights(model)
        self.syncs += 1
