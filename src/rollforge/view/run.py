"""Reading a run directory into the viewer's payload.

A run is either a rollout (``trajectories.jsonl`` + ``metrics.json``, written by ``rollforge
rollout``/``eval``) or a training run (``metrics.jsonl`` + ``trajectories/step-*.jsonl``, written
by ``rollforge train``/``sft``); a trajectories file, or a directory of them, is shown as a rollout
without metrics, and so is a rollout directory that holds only ``trajectories.jsonl.partial`` (the
rollout was interrupted, or still runs: the summary names the file). The payload has two parts:

- ``summary``: what the page needs at load -- run kind, metrics and the header's figures
  (``header.py``), the per-step curve, the held-out
  greedy reward per evaluation (``eval.json``: before, every ``eval_every`` steps, after), and one
  short row per episode (index, step, task, reward, advantage, turns, ending, error and failure
  kinds, token counts) for the list, the filters and the per-step table;
- ``chunks``: the heavy part -- messages (with their images as data URLs, ``image_urls``), token
  ids, loss-mask runs, logprobs, per-turn rewards,
  what training adds (the weight version of each policy token, retries, outcome) --
  as gzip-compressed JSON blobs of ``CHUNK`` episodes each, decompressed by the page only when an
  episode of that chunk is opened. A 10,000-episode run loads without parsing 10,000 token lists.

Token text: with a tokenizer (``model``; a training run's ``config.yaml`` names one, found wherever
the run now is: ``recorded_model``) every distinct id is decoded on its own into ``vocab``; without
one the page shows ids.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import ConfigError, ModelError
from ..train.report import held_out_curve
from ..types import INFRA_FAILURES
from .header import header

logger = logging.getLogger(__name__)

#: Episodes per compressed detail blob.
CHUNK = 100
#: What ``rollforge rollout`` streams episodes to until it finishes (``trajectories.jsonl`` then).
PARTIAL = "trajectories.jsonl.partial"
_STEP = re.compile(r"step-(\d+)\.jsonl$")


@dataclass(frozen=True)
class Payload:
    summary: dict[str, Any]
    chunks: list[str]  # base64 of gzip of a JSON list of episode details
    vocab: str | None  # base64 of gzip of a JSON {id: text}


def load_run(run_dir: str | Path, tokenizer: Any = None) -> Payload:
    """The payload of a run directory, a trajectories file or a directory of them (``trajectory_files``)."""
    run = Path(run_dir)
    source = _source(run)
    rows, details, ids = [], [], set()
    for record, step in source.records:
        rows.append(_row(len(rows), record, step))
        details.append(_detail(record))
        ids.update(record["token_ids"])
    if not rows and run.is_file() and run.stat().st_size:
        raise ConfigError(
            f"{str(run)!r} holds no trajectories: expected records with token_ids and loss_mask, "
            "as trajectories.jsonl holds"
        )
    title = run.resolve().name if run.is_dir() else f"{run.resolve().parent.name}/{run.name}"
    summary = {
        "kind": source.kind,
        "title": title,
        "interrupted": source.interrupted,
        "metrics": source.metrics,
        "header": header(source.kind, source.metrics, source.curve),
        "curve": source.curve,
        "held_out": source.held_out,
        "chunk": CHUNK,
        "columns": list(_COLUMNS),
        "rows": rows,
        "tokenizer": getattr(tokenizer, "name_or_path", None),
    }
    chunks = [_pack(details[i : i + CHUNK]) for i in range(0, len(details), CHUNK)]
    vocab = _pack(_vocab(tokenizer, ids)) if tokenizer is not None else None
    return Payload(summary, chunks, vocab)


@dataclass(frozen=True)
class _Source:
    """What a path holds: the run's kind, its trajectory records (each with its step), metrics
    (``metrics.json``, or a training run's ``eval.json``), the per-step curve, the held-out curve,
    and the ``.partial`` file the records came from when the rollout did not finish."""

    kind: str
    records: Iterator[tuple[dict[str, Any], int | None]]
    metrics: Any = None
    curve: list[dict[str, Any]] = field(default_factory=list)
    held_out: list[dict[str, Any]] = field(default_factory=list)
    interrupted: str | None = None


def _source(run: Path) -> _Source:
    if (run / "trajectories.jsonl").is_file():
        return _Source("rollout", _read(run / "trajectories.jsonl", None), _json(run / "metrics.json"))
    if (run / "metrics.jsonl").is_file():
        evaluations = _json(run / "eval.json")
        return _Source(
            "training",
            _read_files(sorted((run / "trajectories").glob("step-*.jsonl"))),
            evaluations,
            [_numbers(m) for m in _jsonl(run / "metrics.jsonl")],
            [
                {"step": step, "mean": r.get("mean_reward"), **r.get("per_task", {})}
                for step, r in held_out_curve(evaluations or {})
            ],
        )
    if (run / PARTIAL).is_file():  # a rollout that was interrupted (or is still running)
        return _Source("rollout", _read(run / PARTIAL, None), interrupted=str(run / PARTIAL))
    files = trajectory_files(run)  # a rollout's own trajectories.jsonl keeps its metrics.json
    metrics = _json(run.parent / "metrics.json") if run.name == "trajectories.jsonl" else None
    return _Source(
        "rollout", _read_files(files), metrics, interrupted=str(run) if run.name.endswith(".partial") else None
    )


def trajectory_files(path: Path) -> list[Path]:
    """What ``rollforge view`` shows of a path that is not a run directory: the ``.jsonl`` file
    itself (``.jsonl.partial``: a rollout still running), or a directory's ``.jsonl`` files (a
    training run's ``trajectories/``)."""
    if not path.exists():
        raise ConfigError(f"{str(path)!r} does not exist; expected a run directory or a trajectories .jsonl file")
    files = [path] if path.is_file() else sorted(path.glob("*.jsonl"))
    if not files or path.is_file() and not path.name.endswith((".jsonl", ".jsonl.partial")):
        raise ConfigError(
            f"{str(path)!r} is not a run directory or a trajectories file: expected a directory with trajectories.jsonl "
            "(a rollout) or metrics.jsonl (a training run), a .jsonl file of trajectories or a directory of them"
        )
    return files


def tokenizer_for(run_dir: str | Path, model: str | None) -> Any:
    """The tokenizer of ``model``, else of the model named in the run's ``config.yaml`` (beside a
    trajectories file, or above its ``trajectories/`` folder); None when neither is given (the page
    shows ids). The run's model is found wherever the run now is (``recorded_model``); one that
    cannot be found or loaded is a warning, and the page shows ids."""
    if model is not None:
        from ..models import load_tokenizer

        return load_tokenizer(model)
    where = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
    config = where / "config.yaml"
    if not config.is_file() and where.name == "trajectories":
        where = where.parent
        config = where / "config.yaml"
    if not config.is_file():
        return None
    import yaml

    named = ((yaml.safe_load(config.read_text()) or {}).get("model") or {}).get("name")
    if not named:
        return None
    from ..models import load_tokenizer

    found = recorded_model(str(named), where)
    try:
        return load_tokenizer(found)
    except ModelError as exc:
        logger.warning(
            "the run's model %r (%s) cannot be loaded from here (%s); the page shows token ids: pass --model NAME "
            "to decode them",
            named,
            config,
            exc,
        )
        return None


def recorded_model(name: str, run: Path) -> str:
    """Where the model a run's ``config.yaml`` names is now. A run records its model as given, so a
    path is relative to the directory the run was started in (the quickstart's
    ``runs/quickstart/warmup/checkpoints/step-N/model``): viewed from elsewhere, or in a copy of the
    run, it is looked for under ``run`` (its longest tail that exists there, as the warm-up's
    checkpoint inside the run) and then under each directory above ``run``. A name found nowhere
    (an alias, a hub id, a deleted checkpoint) is returned as it is."""
    path = Path(name).expanduser()
    if path.is_dir() or not path.parts:
        return name
    relative = path.parts[1:] if path.is_absolute() else path.parts
    for first in range(len(relative)):
        inside = run.joinpath(*relative[first:])
        if inside.is_dir():
            return str(inside)
    if not path.is_absolute():
        for above in run.resolve().parents:
            if (above / path).is_dir():
                return str(above / path)
    return name


_COLUMNS = ("i", "step", "task", "reward", "adv", "turns", "end", "error", "failures", "tokens", "policy")


def _row(i: int, r: Mapping[str, Any], step: int | None) -> list[Any]:
    error = r.get("error")
    end = (
        "error" if error else next((k for k in ("terminated", "truncated", "max_turns_reached") if r.get(k)), "running")
    )
    reward = r.get("reward", r.get("total_reward"))
    return [
        i,
        step,
        r.get("task_name", "default"),
        _round(reward),
        _round(r.get("advantage")),
        r.get("turns", 0),
        end,
        error["kind"] if error else None,
        sorted({f["kind"] for f in r.get("failures", [])}),
        len(r["token_ids"]),
        sum(r["loss_mask"]),
    ]


def _detail(r: Mapping[str, Any]) -> dict[str, Any]:
    mask = r["loss_mask"]
    runs, current, length = [], 0, 0  # alternating run lengths, starting with mask 0
    for bit in mask:
        if bit != current:
            runs.append(length)
            current, length = bit, 0
        length += 1
    runs.append(length)
    return {
        "index": r.get("index"),
        "messages": [
            {
                "role": m["role"],
                "content": m["content"],
                "name": m.get("name"),
                "calls": [
                    {"name": c.get("name"), "arguments": c.get("arguments"), "error": c.get("error")}
                    for c in m.get("tool_calls", [])
                ],
                "images": image_urls(m.get("images") or []),
            }
            for m in r.get("messages", [])
        ],
        "ids": r["token_ids"],
        "runs": runs,
        "logprobs": [_round(lp, 4) for lp, bit in zip(r["logprobs"], mask) if bit],
        "prompt_length": r.get("prompt_length", 0),
        "rewards": r.get("rewards", []),
        "versions": r.get("versions", []),  # the weight version of each policy token (training)
        "retries": r.get("retries", 0),
        "outcome": _outcome(r.get("error")),
        "error": r.get("error"),
        "failures": r.get("failures", []),
        "metadata": r.get("metadata"),
    }


#: Image types the page shows inline, as ``<img>`` (what ``json_forms.image_bytes`` writes).
SHOWN_IMAGES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def image_urls(images: list[Any]) -> list[str | None]:
    """A message's images (``{"type": "image", "mime", "base64"}`` in trajectory JSON) as data URLs
    for the page's ``<img>`` elements; None for one it does not show (another type, or not base64:
    nothing but a picture's bytes reaches an attribute)."""
    urls: list[str | None] = []
    for image in images:
        mime, data = (image.get("mime"), image.get("base64")) if isinstance(image, dict) else (None, None)
        shown = mime in SHOWN_IMAGES and isinstance(data, str) and _BASE64.fullmatch(data)
        urls.append(f"data:{mime};base64,{data}" if shown else None)
    return urls


def _outcome(error: Mapping[str, Any] | None) -> str:
    """``Trajectory.outcome`` of a record: what training does with the episode."""
    if not error:
        return "completed"
    return "infra_failure" if error.get("kind") in INFRA_FAILURES else "policy_failure"


def _vocab(tokenizer: Any, ids: set[int]) -> dict[str, str]:
    fast = getattr(tokenizer, "backend_tokenizer", None)
    if fast is not None:
        return {str(i): fast.decode([i], skip_special_tokens=False) for i in sorted(ids)}
    return {str(i): tokenizer.decode([i], skip_special_tokens=False) for i in sorted(ids)}


def _pack(value: Any) -> str:
    raw = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def _round(value: Any, digits: int = 4) -> Any:
    return round(float(value), digits) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _numbers(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _read_files(files: list[Path]) -> Iterator[tuple[dict[str, Any], int | None]]:
    """The trajectories of the files, each with the step its name gives (``step-N.jsonl``)."""
    for f in files:
        step = _STEP.search(f.name)
        yield from _read(f, int(step.group(1)) if step else None)


def _read(path: Path, step: int | None) -> Iterator[tuple[dict[str, Any], int | None]]:
    for record in _jsonl(path):
        if "token_ids" in record and "loss_mask" in record:
            yield record, step


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            try:
                value = json.loads(line)
            except json.JSONDecodeError:  # a torn last line of a killed run
                continue
            if isinstance(value, dict):
                yield value


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None
