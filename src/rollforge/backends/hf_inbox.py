"""What other threads send the HF backend's one worker, in the order they sent it.

Design: one thread-safe ``queue.Queue`` carries requests and two control items: ``SHUTDOWN``
(stop after the current step) and ``FORGET_PREFIXES`` (the weights changed, so stored prefix
caches are stale). ``drain_requests`` empties it without waiting, keeping the requests (to fail
them); ``stop_worker`` is the interpreter-exit stop of a backend nobody closed.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

logger = logging.getLogger(__name__)

SHUTDOWN = object()  # queue sentinel
FORGET_PREFIXES = object()  # queue item: the weights changed, stored caches are stale


def drain_requests(jobs: queue.Queue) -> list[Any]:
    """Empty ``jobs`` without waiting; the requests that were in it, in order."""
    requests = []
    while True:
        try:
            item = jobs.get_nowait()
        except queue.Empty:
            return requests
        if item is not SHUTDOWN and item is not FORGET_PREFIXES:
            requests.append(item)


def stop_worker(jobs: queue.Queue, worker: threading.Thread, timeout: float = 60.0) -> None:
    """At interpreter exit: let the worker finish its step and stop while Python still runs."""
    jobs.put(SHUTDOWN)
    worker.join(timeout)
    if worker.is_alive():
        logger.warning("the HF backend worker did not stop within %.0fs at exit; call close()", timeout)
