"""``rollforge bench vs-trl --best``: each side's fastest configuration on this machine, measured.

Candidates (``CANDIDATES``): rollforge with the HF backend or in-process vLLM, each synchronous
(``max_staleness`` 0) or generating one weight version ahead (1); TRL with ``model.generate`` or
a colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``). Each candidate trains alone for
``best_steps`` steps (``DEFAULT_BEST_STEPS``), the first untimed (never alternating with the other
side: an asynchronous run goes on generating between its steps). Four by default: an asynchronous
run's last step has no next batch generating beside it, unlike a long run's steps; with three
steps that was one of two timed steps and biased the candidate's mean, with four it is one of
three. The fastest mean timed step of each side wins; a candidate that fails is recorded with its
error in one line and never wins. The two winners then train ``steps`` steps each, one after the
other, and ``ratio_step_time_best`` is rollforge's mean timed step over TRL's (a fresh
measurement, not the minimum of noisy candidates).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .runners import run_rollforge
from .settings import Settings
from .trl_side import run_trl
from .workloads import Workload

#: Steps per candidate with ``--best`` (the first untimed).
DEFAULT_BEST_STEPS = 4
#: name -> (side, the ``Settings`` fields it changes)
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "rollforge-hf-sync": ("rollforge", {"backend": "hf", "max_staleness": 0}),
    "rollforge-hf-async1": ("rollforge", {"backend": "hf", "max_staleness": 1}),
    "rollforge-vllm-sync": ("rollforge", {"backend": "vllm", "max_staleness": 0}),
    "rollforge-vllm-async1": ("rollforge", {"backend": "vllm", "max_staleness": 1}),
    "trl-hf": ("trl", {"trl_vllm": False}),
    "trl-vllm-colocate": ("trl", {"trl_vllm": True}),
}
RUNNERS = {"trl": run_trl, "rollforge": run_rollforge}


def parse_candidates(text: str) -> tuple[str, ...]:
    """``--candidates``: a comma-separated subset of ``CANDIDATES`` naming at least one per side."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ConfigError(
            f"--candidates: unknown candidate {unknown[0]!r}; expected names from {', '.join(CANDIDATES)}"
        )
    missing = [side for side in RUNNERS if not any(CANDIDATES[n][0] == side for n in names)]
    if missing:
        raise ConfigError(f"--candidates {text!r} names no {missing[0]} candidate; --best needs one per side at least")
    return names


def run_best(
    workload: Workload,
    settings: Settings,
    folder: Path,
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    """Time every candidate, rerun each side's fastest; ``summarize`` turns runs into a summary."""
    candidates: dict[str, dict[str, Any]] = {}
    for name in settings.candidates:
        side, changes = CANDIDATES[name]
        try:
            with environ_restored():
                run = RUNNERS[side](
                    workload, dataclasses.replace(settings, **changes, steps=settings.best_steps), folder / name
                )
        except Exception as exc:  # an unavailable configuration is a finding, not the end of the benchmark
            candidates[name] = {"side": side, "error": _one_line(exc)}
            continue
        summary = summarize([run])
        candidates[name] = {
            "side": side,
            "configuration": summary["configuration"],
            "seconds_per_step": summary["seconds_per_step"],
            "phases_seconds_per_step": summary["phases_seconds_per_step"],
            "step_seconds": summary["step_seconds"][0],
        }
    result: dict[str, Any] = {
        "ratio_step_time_best": None,
        "best_steps": settings.best_steps,
        "candidates": candidates,
    }
    chosen = {}
    for side in RUNNERS:
        timed = {n: c["seconds_per_step"] for n, c in candidates.items() if c["side"] == side and "error" not in c}
        if not timed:
            result["best_error"] = f"no {side} candidate ran (see candidates)"
            return result
        chosen[side] = min(timed, key=timed.__getitem__)
    for side, name in chosen.items():
        with environ_restored():
            run = RUNNERS[side](workload, dataclasses.replace(settings, **CANDIDATES[name][1]), folder / f"best-{name}")
        result[f"best_{side}"] = {"candidate": name, **summarize([run])}
    result["ratio_step_time_best"] = round(
        result["best_rollforge"]["seconds_per_step"] / result["best_trl"]["seconds_per_step"], 4
    )
    return result


@contextlib.contextmanager
def environ_restored() -> Iterator[None]:
    """``os.environ`` as it was, after a candidate: TRL's colocated vLLM sets ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in the process, after which every later
    ``train()`` in it took itself for a torchrun rank (Ray training ran in-process, alone)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text[:400]}"
