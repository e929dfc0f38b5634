"""Watching the training ranks on Ray until they end: rank 0's result, or one line saying which rank
was lost, on which node, and where the run stopped.

Why a watch: the ranks meet in gloo collectives, and a rank whose peer is gone either fails with a
bare ``Connection reset by peer`` (the peer's process died and its sockets closed) or, when the
peer's machine went silent, blocks until gloo's timeout (30 minutes by default). Neither names what
was lost. So the driver waits on every rank's result at once (``ray.wait``, woken every ``TICK``
seconds so that Ctrl-C lands) and decides at the first rank that ends badly:

- Ray lost it (``dead``: its actor died, its process crashed or was killed for memory, its node
  died): the run lost that rank. Ray reports it as soon as the driver's connection to the actor
  closes, and for a node that goes silent once Ray's health checks declare the node dead (about a
  minute with Ray's defaults), never on gloo's clock;
- it raised a refusal (a ``RollforgeError``): raised again as it is, the same one line as in one
  process;
- it raised anything else: that may be a collective failing because a peer is gone, which the
  survivor often sees a moment before Ray reports the peer. The other ranks get ``NOTICE`` seconds
  (or until they have all ended) to show a death, which is then reported instead; otherwise the
  error is raised as it is.

Whatever ended the watch, every rank's actor is killed and the watch waits (at most ``NOTICE``
seconds) until their calls have ended, so that nothing writes to the run directory any more when
``stopped_at`` reads where the run stands (``cluster/`` knows nothing of the run's files: the
caller hands it a reader). A lost rank is a ``RollforgeError`` of one line (``lost_rank_message``):
the rank, its node's id (the first 8 hex digits of the ``NodeID`` Ray lists) and address, Ray's reason, where the run stopped and how to continue.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Sequence

from ..errors import RollforgeError
from ..placement import Placement
from .connect import actor_death_reason

#: Seconds between two looks at the ranks when none ended (Ctrl-C is noticed within it).
TICK = 1.0
#: Seconds the other ranks get to show a death after a rank's error, and the killed ranks to end.
NOTICE = 20.0


def watch(
    ray: Any,
    actors: Sequence[Any],
    where: Sequence[Placement],
    runs: Sequence[Any],
    stopped_at: Callable[[], str],
    notice: float = NOTICE,
) -> Any:
    """Rank 0's result once every rank's ``runs[i]`` (a call on ``actors[i]``, which runs on
    ``where[i]``) has ended well; otherwise stop them all and raise what ended the run (see the
    module docstring)."""
    failed = _first_failure(ray, runs)
    if failed is None:
        return ray.get(runs[0])
    rank, error = failed
    if not dead(ray, error) and _refusal(ray, error) is None:
        rank, error = _death_among(ray, runs, notice) or (rank, error)
    _stop(ray, actors, runs, notice)
    if dead(ray, error):
        raise RollforgeError(lost_rank_message(where[rank], death_reason(ray, error), stopped_at())) from None
    refusal = _refusal(ray, error)
    if refusal is not None:
        raise refusal from None
    raise error


def lost_rank_message(where: Placement, reason: str, stopped_at: str) -> str:
    """One line: the training rank that was lost, its node and why, then ``stopped_at`` (where the
    run stopped and what ``--resume`` continues from), then how to continue on fewer nodes."""
    line = (
        f"{where.name} on Ray node {where.node[:8]} ({where.host}) was lost ({reason}); {stopped_at}; "
        "on fewer nodes, set ray.training_workers to what they hold"
    )
    return " ".join(line.split())


def dead(ray: Any, error: Exception) -> bool:
    """Whether a rank's call failed because Ray lost the rank (its actor died, its worker process
    crashed or was killed for memory, its node died), not because the rank raised."""
    lost = ray.exceptions
    return isinstance(error, (lost.RayActorError, lost.OutOfMemoryError, lost.WorkerCrashedError, lost.NodeDiedError))


def death_reason(ray: Any, error: Exception) -> str:
    """Ray's reason for a rank's death, its first sentence (``the actor died because its node has
    died``; Ray's advice on the causes of a death follows it). An actor Ray calls "unavailable" is
    one whose connection closed (its process was killed, or its node went down with it)."""
    if isinstance(error, ray.exceptions.ActorUnavailableError):
        return "its connection closed: the worker process or its node is gone"
    reason = re.split(r"(?<=[a-z])\. ", actor_death_reason(error), maxsplit=1)[0].rstrip(".")
    return reason[:1].lower() + reason[1:]


def _first_failure(ray: Any, runs: Sequence[Any]) -> tuple[int, Exception] | None:
    """(rank, error) of the first rank whose call fails, or None when every call ended well."""
    pending = {ref: rank for rank, ref in enumerate(runs)}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=TICK)
        for ref in done:
            rank = pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:  # Ray lost the rank, or the rank raised (RayTaskError)
                return rank, error
    return None


def _death_among(ray: Any, runs: Sequence[Any], notice: float) -> tuple[int, Exception] | None:
    """(rank, error) of a rank that Ray lost within ``notice`` seconds, while any rank runs."""
    deadline = time.monotonic() + notice
    pending = {ref: rank for rank, ref in enumerate(runs)}
    while pending and (left := deadline - time.monotonic()) > 0:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=min(TICK, left))
        for ref in done:
            rank = pending.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                if dead(ray, error):
                    return rank, error  # else another rank's own error: keep looking for a death
    return None


def _stop(ray: Any, actors: Sequence[Any], runs: Sequence[Any], notice: float) -> None:
    """Kill every rank's actor and wait, at most ``notice`` seconds, until their calls have ended."""
    for actor in actors:
        ray.kill(actor, no_restart=True)
    ray.wait(list(runs), num_returns=len(runs), timeout=notice)


def _refusal(ray: Any, error: Exception) -> RollforgeError | None:
    """The ``RollforgeError`` a rank raised (a refusal), or None."""
    if isinstance(error, ray.exceptions.RayTaskError) and isinstance(error.cause, RollforgeError):
        return error.cause
    return None
