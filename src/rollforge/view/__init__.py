"""``rollforge view RUN_DIR``: one self-contained HTML file for a rollout or training run (or a
trajectories file, or a directory of them).

The page needs no server and no network: its CSS and JavaScript (``page.html``, ``viewer.css``,
``viewer.js``, package data) are inlined, and the run's data is embedded -- a JSON summary (one
short row per episode, metrics, the per-step curve) and gzip-compressed blobs of episode details
that the browser decompresses with its built-in ``DecompressionStream`` only when an episode of
that blob is opened (``run.py``). The list is paged, so a run of any size renders one page of rows.

What it shows: episodes filtered by environment, reward range, ending, error or failure kind and
step; per episode its messages (their images inline) and tool calls, per-turn rewards, advantage, error and failures,
and its tokens coloured by loss mask (policy tokens vs prompt/template/tool tokens) with each
token's id and generation logprob on hover; for training runs the reward curve (inline SVG) and a
per-step table that filters the list.
"""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

from ..files import atomic_write
from .run import Payload, load_run, tokenizer_for

__all__ = ["render_html", "write_view"]


def write_view(
    run_dir: str | Path, out: str | Path | None = None, *, model: str | None = None, tokenizer: Any = None
) -> Path:
    """Write the viewer of ``run_dir`` (or of a trajectories file) to ``out`` (default
    ``RUN_DIR/view.html``, or the file's name with ``.html``) and return its path.
    Token text comes from ``tokenizer``, else ``model``'s, else the run's configured model; else ids."""
    if tokenizer is None:
        tokenizer = tokenizer_for(run_dir, model)
    payload = load_run(run_dir, tokenizer)
    source = Path(run_dir)
    path = Path(out) if out is not None else source / "view.html" if source.is_dir() else source.with_suffix(".html")
    return atomic_write(path, render_html(payload))


def render_html(payload: Payload) -> str:
    files = resources.files(__package__)
    page = files.joinpath("page.html").read_text(encoding="utf-8")
    blobs = "\n".join(
        f'<script type="text/plain" class="rf-chunk" data-chunk="{i}">{chunk}</script>'
        for i, chunk in enumerate(payload.chunks)
    )
    if payload.vocab is not None:
        blobs += f'\n<script type="text/plain" id="rf-vocab">{payload.vocab}</script>'
    parts = {
        "/*CSS*/": files.joinpath("viewer.css").read_text(encoding="utf-8"),
        "/*SUMMARY*/": _script_json(payload.summary),
        "<!--BLOBS-->": blobs,
        "/*JS*/": files.joinpath("viewer.js").read_text(encoding="utf-8"),
    }
    # one pass, so that text inside the inserted data is never taken for a placeholder
    return re.sub(r"/\*(?:CSS|SUMMARY|JS)\*/|<!--BLOBS-->", lambda m: parts[m.group(0)], page)


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no ``</script>`` or ``<!--`` can end it early)."""
    return json.dumps(_finite(value), separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _finite(value: Any) -> Any:
    """NaN and infinities (a metric over nothing) become null, which JSON can carry."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
