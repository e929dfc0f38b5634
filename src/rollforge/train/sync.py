"""Weight sync: after every update, the generation backend must serve the new policy before the
next rollout starts, or the run silently trains on stale samples.

A backend that generates with the trained model object itself (``Backend.shares_model``, e.g.
``HFBackend(model)``) only has to forget caches computed with the old weights
(``invalidate_cache()``). Any other backend must implement the optional ``WeightSync`` protocol
(``update_weights(model)``, see ``backends/base.py``; ``Backend.syncs_weights``); one that has
neither is rejected when training starts, not after a step.
"""

from __future__ import annotations

from typing import Any

from ..backends.base import Backend
from ..errors import ConfigError


class WeightSync:
    def __init__(self, backend: Backend, model: Any):
        self.backend = backend
        self.shared = backend.shares_model(model)
        if not self.shared and not backend.syncs_weights:
            raise ConfigError(
                f"{type(backend).__name__} neither generates with the trained model object nor has "
                f"update_weights(model); it would keep serving the initial weights"
            )
        self.syncs = 0

    async def release(self) -> None:
        """Called right before the update (a colocated engine frees its memory there)."""

    async def push(self, model: Any) -> None:
        if self.shared:
            self.backend.invalidate_cache()  # caches computed with the old weights must not be reused
            return
        await self.backend.update_weights(model)
        self.syncs += 1
