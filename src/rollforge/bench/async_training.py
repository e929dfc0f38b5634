"""Asynchronous vs synchronous training: wall time of the same run at ``max_staleness`` 0, 1 and 2.

Generation and training must not share compute for overlap to pay (on one CPU they would just take
turns), so generation is remote inference stood in for by a scripted backend with known latency:
each request sleeps ``latency x u`` seconds, u drawn in [0.5, 1] from the request's seed, and
answers a letter drawn from the seed (so rewards vary within groups) followed by some 30 tokens
of text (so the updates have tokens to train on). The
updates are real: the tiny test model (``rollforge.testing``) trained with GRPO on FirstCharacter.
``--latency auto`` sets the latency at which generating a batch takes as long as updating on it,
the case where overlap helps most. Generation time is not the latency: the engine adds its own CPU,
and 64 episodes at the default concurrency of 32 wait for two requests in turn. So it times three
synchronous steps at zero latency (generation g0, update u: medians of the last two) and three at
latency u (g1), takes the generation time per second of latency, c = (g1 - g0) / u, and sets the
latency to (u - g0) / c. (Until 2026-11-26 the latency was u itself: generation then took about
twice the update, and the ratio could not go below about 0.65.)

Per run (same seed, same prompts, same requests):

- ``wall_seconds``: the trainer's time over all steps (``time/step`` summed: waiting for the
  batch, scoring, update, weight push);
- ``bound_seconds``: max(generation, update) summed per step, what perfect overlap would take
  (generation = the batch's rollout wall time, update = scoring + update + push);
- ``async_to_bound`` = wall / bound (target <= 1.1 for k >= 1; a synchronous run is near
  (generation + update) / max of the two);
- ``token_lag_max``: the oldest token trained, in versions (at most k);
- the admission figures (``train/admission.py``): ``duration_bias_max`` and
  ``difficulty_bias_max`` (the largest over the steps of the largest gap, over quartiles, between
  the share of admitted and of finished episodes) and ``dropped``.

Run side by side, generation and update slow each other a little (the engine's Python and the
update share the interpreter lock and the cores), so each is measured in its own run;
``async_to_sync_bound`` divides k = 1's wall time by the bound computed from k = 0's undisturbed
times instead.

``ratio_async_to_sync`` = wall(k=1) / wall(k=0) (target <= 0.6 when generation and update take
about equal time); ``ratio_k2_to_sync`` the same for k = 2.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

LETTERS = "aB3xY7kQ9z"  # digits, capitals and lower case: rewards vary within a group


def add_arguments(parser: Any) -> None:
    parser.add_argument("--steps", type=int, default=24, help="training steps per run (default 24)")
    parser.add_argument(
        "--latency",
        default="auto",
        help="seconds per generation request at u=1, or 'auto' (a batch generates in about its update's time)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step (default 8)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per prompt (default 8)")


def main(args: Any) -> dict[str, Any]:
    return asyncio.run(_main(args))


async def _main(args: Any) -> dict[str, Any]:
    from ..testing import first_character_rows, make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / "model")
        data = root / "prompts.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in first_character_rows(64)))
        if args.latency == "auto":
            zero = (await _run(root, model, data, args, k=0, steps=3, latency=0.0))[1:]  # the first step warms up
            probe = statistics.median(_update_seconds(m) for m in zero)
            latency = balanced_latency(
                zero, (await _run(root, model, data, args, k=0, steps=3, latency=probe))[1:], probe
            )
        else:
            latency = float(args.latency)
        runs = {
            k: _summary(await _run(root, model, data, args, k=k, steps=args.steps, latency=latency), k)
            for k in (0, 1, 2)
        }
    return {
        "steps": args.steps,
        "episodes_per_step": args.batch_size * args.group_size,
        "latency_seconds": round(latency, 4),
        "runs": {f"max_staleness_{k}": v for k, v in runs.items()},
        "ratio_async_to_sync": round(runs[1]["wall_seconds"] / runs[0]["wall_seconds"], 3),
        "ratio_k2_to_sync": round(runs[2]["wall_seconds"] / runs[0]["wall_seconds"], 3),
        "async_to_bound": runs[1]["async_to_bound"],
        # the stricter bound: generation and update as long as when they do not overlap (k = 0)
        "async_to_sync_bound": round(runs[1]["wall_seconds"] / runs[0]["bound_seconds"], 3),
        "targets": {"ratio_async_to_sync": "<= 0.6", "async_to_bound": "<= 1.1"},
    }


async def _run(root: Path, model: Path, data: Path, args: Any, *, k: int, steps: int, latency: float) -> list[dict]:
    from ..recipes.launch import atrain
    from ..train.config import load_config

    config = load_config(
        overrides=[
            f"model.name={model}",
            f"out={root / f'run_{k}_{steps}_{latency:.6f}'}",
            f"steps={steps}",
            f"data.path={data}",
            "environments=[{name: 'rollforge.testing:FirstCharacter', task_name: first}]",
            f"algorithm.batch_size={args.batch_size}",
            f"algorithm.group_size={args.group_size}",
            "rollout.max_new_tokens=48",
            "rollout.max_turns=1",
            "optim.lr=1e-3",
            "checkpoint_every=0",
            "save_trajectories=false",
            "eval_episodes=0",
            f"algorithm.max_staleness={k}",
        ]
    )
    async with remote_backend(model, latency) as backend:
        result = await atrain(config, console=False, backend=backend)
    return result.history


def remote_backend(model: Path, latency: float):
    """A scripted backend standing in for a remote server: latency per request, weights "pushed"
    by counting them (a real server would load them)."""
    from ..backends.scripted import ScriptedBackend
    from ..models import load_tokenizer

    tokenizer = load_tokenizer(str(model))

    class Remote(ScriptedBackend):
        weight_version = 0

        async def generate(self, prompt_ids, params):
            draw = random.Random(params.seed)
            await asyncio.sleep(latency * draw.uniform(0.5, 1.0))
            return await super().generate(prompt_ids, params)

        async def update_weights(self, model: Any) -> None:
            self.weight_version += 1

    filler = " then some more words to train on" * 4  # longer replies: the update has tokens to work on

    return Remote(
        lambda request: random.Random(request.params.seed).choice(LETTERS) + filler,
        tokenizer,
        end_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )


def balanced_latency(zero: list[dict[str, Any]], probed: list[dict[str, Any]], probe: float) -> float:
    """The latency at which a batch generates in about its update's time, from synchronous steps at
    zero latency and at latency ``probe``: generation grows by c seconds per second of latency."""
    g0, g1 = (statistics.median(_generation_seconds(m) for m in steps) for steps in (zero, probed))
    update = statistics.median(_update_seconds(m) for m in zero)
    per_second = (g1 - g0) / probe if probe > 0 and g1 > g0 else 1.0
    return max(0.0, (update - g0) / per_second)


def _update_seconds(m: dict[str, Any]) -> float:
    return m["time/score"] + m["time/update"] + m["time/sync"]


def _generation_seconds(m: dict[str, Any]) -> float:
    return m.get("async/rollout_seconds", m.get("time/rollout", 0.0))


def _summary(history: list[dict[str, Any]], k: int) -> dict[str, Any]:
    wall = sum(m["time/step"] for m in history)
    bound = sum(max(_generation_seconds(m), _update_seconds(m)) for m in history)
    last = history[-1]
    lags = [m["async/token_lag_max"] for m in history if m.get("async/token_lag_max") is not None]
    return {
        "wall_seconds": round(wall, 3),
        "bound_seconds": round(bound, 3),
        "async_to_bound": round(wall / bound, 3),
        "generation_seconds_per_step": round(statistics.fmean(_generation_seconds(m) for m in history), 3),
        "update_seconds_per_step": round(statistics.fmean(_update_seconds(m) for m in history), 3),
        "mean_reward": round(statistics.fmean(m["reward/mean"] for m in history), 3),
        "token_lag_max": max(lags) if lags else 0 if k == 0 else None,
        "duration_bias_max": _largest(history, "admission/duration_bias"),
        "difficulty_bias_max": _largest(history, "admission/difficulty_bias"),
        "dropped": last.get("admission/dropped", 0),
    }


def _largest(history: list[dict[str, Any]], key: str) -> float | None:
    values = [m[key] for m in history if m.get(key) is not None]
    return round(max(values), 3) if values else None
