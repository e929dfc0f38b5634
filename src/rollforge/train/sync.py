"""Weight sync: after every update, the generation backend must serve the new policy before the
next rollout starts, or the run silently trains on stale samples.

A backend that generates with the trained model object itself (``HFBackend(model)``) only has
to forget caches computed with the old weights (``invalidate_cache()``). Any other backend must implement the optional ``update_weights(model)`` coroutine (see
``backends/base.py``); one that has neither is rejected when training starts, not after a step.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError


class WeightSync:
    def __init__(self, backend: Any, model: Any):
        self.backend = backend
        self.shared = getattr(backend, "model", None) is model
        if not self.shared and not callable(getattr(backend, "update_weights", None)):
            raise ConfigError(
                f"{type(backend).__name__} neither generates with the trained model object nor has "
                f"update_weights(model); it would keep serving the initial weights"
            )
        self.syncs = 0

    async def push(self, model: Any) -> None:
        if self.shared:
            invalidate = getattr(self.backend, "invalidate_cache", None)
            if callable(invalidate):  # caches computed with the old weights must not be reused
                invalidate()
            return
        await self.backend.update_weights(model)
        self.syncs += 1
