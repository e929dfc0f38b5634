"""What a backend returns for one request: ``Completion``, with the vocabulary of why generation
ended (``FINISH_REASONS``) and, for a replica on a Ray actor, where it was generated
(``placement.py``). ``types`` re-exports all three: backends and the engine read them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import InvariantError
from .placement import Placement

FinishReason = Literal["stop", "length", "abort"]
#: The finish reasons a backend may report (an engine's or server's other reasons are its errors).
FINISH_REASONS: frozenset[str] = frozenset(("stop", "length", "abort"))


@dataclass(frozen=True)
class Completion:
    """What a backend returns for one request: the generated ids exactly as sampled, the logprob
    of each under the sampling distribution, and why generation ended (``stop``: a stop token or
    stop string; ``length``: the token budget; ``abort``: the backend gave up)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    #: The weight version that generated it, when the backend is versioned (asynchronous training).
    version: int | None = None
    #: The Ray replica that generated it (``cluster/replicas.py`` sets it on the driver); None when
    #: the backend runs in this process. The engine records the episode's last one.
    served_by: Placement | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise InvariantError(f"completion has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
