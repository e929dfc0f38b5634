"""The strict-JSON forms of the values trajectories hold, as ``trajectories.jsonl`` writes them.

Strict JSON has no NaN or infinities: a non-finite float is written as a string ``float()`` reads
back (``json_float``); any other value becomes JSON data or, failing that, its ``repr``
(``jsonable``). ``types.py`` writes with these; this module imports nothing of rollforge.
"""

from __future__ import annotations

import math
from typing import Any, Mapping


def json_float(value: float | None) -> float | str | None:
    """Strict JSON has no NaN or infinities: those are written as the strings ``"NaN"``,
    ``"Infinity"`` and ``"-Infinity"``, which ``float()`` reads back (``null`` would be ambiguous:
    a null logprob marks a token the policy did not generate)."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: mappings and sequences recursively, non-finite floats as
    ``json_float`` writes them, anything else that JSON cannot hold as its ``repr``."""
    if isinstance(value, float):
        return json_float(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)
