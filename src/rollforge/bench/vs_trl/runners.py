"""The two sides of ``rollforge bench vs-trl``: a TRL ``GRPOTrainer`` run (``run_trl``, in
``vs_trl.trl_side``), a rollforge ``train`` run (``run_rollforge``, here), each returning per-step
seconds (with where they went), rewards and work counts, and ``Turns``, which makes the two take
strictly alternating steps when they run together (``run_alternating``; see ``vs_trl``'s docstring
for the settings and ``vs_trl.workloads`` for what they train on).

Where a step's time goes, per side (seconds; ``other`` is the step minus the two):

- TRL: ``generation`` is ``_generate`` (prompt tokenizing, ``model.generate``, tool calls);
  ``update`` is ``training_step`` (summed over the step's micro-batches) less its ``_prepare_inputs``
  (the loss forwards and backwards) plus what follows up to ``on_step_end`` (gradient clipping,
  optimizer and scheduler steps); ``other`` is mostly ``_prepare_inputs`` less ``_generate``
  (rewards, advantages, padding). ``vs_trl.trl_side.StepClock`` measures them.
- rollforge: ``generation`` is ``time/rollout`` (generation, environment steps, rewards,
  advantages), or with ``max_staleness`` >= 1 ``time/wait`` (the part of the batch's generation the
  update did not hide); ``update`` is ``time/update``; ``other`` is the rest (scoring, and
  ``time/sync``: pushing weights to the backend, nothing to copy when it shares the trainer's model).

Each side's configuration comes from the settings (``settings.Settings``): TRL generates with ``model.generate`` or, with
``trl_vllm``, a colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``); rollforge with the
``backend`` given (``hf`` or in-process ``vllm``), synchronously or ``max_staleness`` versions ahead.
``max_completion_tokens`` is an episode's token budget on both sides (TRL's ``max_completion_length``;
rollforge's ``max_seq_len`` less the prompt); rollforge takes ``max_turns`` (default
``max_tool_calls + 1``) and a per-turn ``max_new_tokens`` (default the budget) where they are given.
Both sample from the full softmax at temperature 1 (no top-p, top-k, min-p or repetition penalty;
each run records its ``sampling``), and TRL lists the tools in rollforge's (the class's) order.
``trl_micro_batch`` (default all ``n`` completions): TRL's completions per loss forward
(``per_device_train_batch_size``; ``gradient_accumulation_steps`` makes up ``n``, still one
generation and one optimizer step per step), as rollforge's update splits by ``micro_batch_tokens``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from ...errors import OtherSideFailed
from .settings import Settings
from .trl_side import run_trl, sampling_settings
from .workloads import Workload

# -- alternation -----------------------------------------------------------------------------------


class Turns:
    """TRL (this thread) and rollforge (another thread) take strictly alternating training steps, TRL
    first, so that load from other processes falls on both alike and their work never overlaps.

    TRL waits in ``on_step_begin`` (before its clock starts) and hands over in ``on_step_end``.
    Rollforge waits for its first turn before ``train`` starts (so its set-up never overlaps a
    timed TRL step) and hands over in ``train``'s ``on_step`` hook, after its step's clock stopped."""

    def __init__(self):
        self.trl_turn, self.rollforge_turn, self.rollforge_done = (threading.Event() for _ in range(3))
        self.trl_turn.set()  # TRL goes first
        self.failed = False

    def wait(self, event: threading.Event) -> None:
        while not event.wait(1.0):
            if self.failed:
                raise OtherSideFailed("the other trainer of the comparison failed (its error follows)")
        event.clear()

    def rollforge_hook(self, last_step: int):
        """``train``'s ``on_step``: hand over to TRL and wait, except after the last step."""

        def on_step(step: int, *_: Any) -> None:
            if step < last_step:
                self.trl_turn.set()
                self.wait(self.rollforge_turn)

        return on_step


def run_alternating(workload: Workload, s: Settings, out: Path, after_steps: dict[str, Any] | None = None):
    """Both runs, alternating; ``after_steps`` maps a side to its ``after_step`` (see ``run_trl`` and
    ``run_rollforge``), which runs on that side's turn, so it never overlaps the other's step."""
    turns = Turns()
    after_steps = after_steps or {}
    outcome: dict[str, Any] = {}

    def rollforge_side():
        try:
            turns.wait(turns.rollforge_turn)
            outcome["run"] = run_rollforge(workload, s, out / "rollforge", turns, after_steps.get("rollforge"))
        except BaseException as exc:  # handed to the main thread, which re-raises it
            outcome["error"] = exc
            turns.failed = True
        finally:
            turns.rollforge_done.set()

    thread = threading.Thread(target=rollforge_side, name="rollforge-trainer", daemon=True)
    thread.start()
    try:
        trl_run = run_trl(workload, s, out / "trl", turns, after_steps.get("trl"))
    except BaseException as exc:
        turns.failed = True
        thread.join()
        if "error" in outcome and not isinstance(outcome["error"], OtherSideFailed):
            raise outcome["error"] from exc  # rollforge failed first; TRL only stopped waiting for it
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return trl_run, outcome["run"]


# -- rollforge -------------------------------------------------------------------------------------


def run_rollforge(
    workload: Workload, s: Settings, out: Path, turns: "Turns | None" = None, after_step: Any = None
) -> dict[str, Any]:
    """``after_step(step, model, backend)`` (async): awaited after each step, before rollforge hands over."""
    from ...chat.render import ChatRenderer
    from ...envs.tools import discover_tools
    from ...models import load_tokenizer
    from ...recipes.launch import train
    from ...types import Message

    tokenizer = load_tokenizer(workload.model_dir)
    tools = tuple(t.schema() for factory in workload.tools for t in discover_tools(factory()).values())
    renderer = ChatRenderer(tokenizer)
    lengths = [
        len(
            renderer.prompt_ids([Message(m["role"], m["content"]) for m in row["prompt"]], tools)
            + renderer.generation_prompt
        )
        for row in workload.rows
    ]
    n = s.completions
    config = _rollforge_config(workload, s, out, max(lengths) + s.max_completion_tokens)
    hook = _then(after_step, turns.rollforge_hook(s.steps) if turns is not None else None)
    started = time.perf_counter()
    result = train(config, dataset=workload.rows, console=False, on_step=hook)
    run_seconds = time.perf_counter() - started
    steps = [
        {
            "reward": m["reward/mean"],
            "generated_tokens": m["rollout/mean_gen_tokens_per_sample"] * n,
            "assistant_turns": m["rollout/total_turns"],
            "tool_calls": m["rollout/total_turns"] - n if workload.multi_turn else 0,
            "phases": _rollforge_phases(m),
            "context_tokens": None,
            "tool_failures": sum(v for k, v in m.items() if k.startswith("rollout/failures/")),
            "trained_tokens": m["trained_tokens"],
            "micro_batches": m.get("micro_batches"),
        }
        for m in result.history
    ]
    return {
        "step_seconds": [m["time/step"] for m in result.history],
        "steps": steps,
        "rewards": [round(x["reward"], 4) for x in steps],
        "run_seconds": run_seconds,
        "prompt_tokens": lengths[0],
        "configuration": {
            "backend": config.model.backend,  # as the trainer ran: its metrics name the staleness
            "max_staleness": result.history[-1].get("async/max_staleness", 0),
            "sampling": {**sampling_settings(config.rollout), "min_p": None, "repetition_penalty": 1.0},
        },
    }


def _rollforge_config(workload: Workload, s: Settings, out: Path, max_seq_len: int) -> Any:
    """The training config of rollforge's side: the comparison's settings ``s`` (module docstring)."""
    from ...train.config import load_config

    return load_config(
        out=str(out),
        steps=s.steps,
        seed=s.seed,
        checkpoint_every=0,
        save_trajectories=False,
        model={
            "name": str(workload.model_dir),
            "dtype": s.dtype,
            "device": s.device or "auto",
            "backend": s.backend,
        },
        environments=[workload.rollforge_environment],
        data={"shuffle": s.shuffle},
        algorithm={
            "batch_size": s.batch_size,
            "group_size": s.generations,
            "advantage": "grpo",
            "loss_aggregation": "token",
            "clip_low": 0.2,
            "clip_high": 0.2,
            "kl_beta": 0.0,
            "epochs_per_batch": 1,
            "max_staleness": s.max_staleness,
            "skip_zero_advantage": s.skip_zero_advantage,
        },
        optim={
            "lr": s.lr,
            "betas": [0.9, 0.999],
            "weight_decay": 0.0,
            "schedule": "constant",
            "warmup_steps": 0,
            "max_grad_norm": 1.0,
        },
        rollout={
            "mode": s.rollforge_mode,
            "max_turns": s.max_turns if s.max_turns is not None else s.max_tool_calls + 1,
            "max_new_tokens": s.max_new_tokens if s.max_new_tokens is not None else s.max_completion_tokens,
            "max_seq_len": max_seq_len,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "concurrency": s.completions,
            "seed": s.seed,
        },
    )


def _then(first: Any, then: Any) -> Any:
    """``train``'s ``on_step``: the async ``first(step, model, backend)``, then ``then``'s hand-over."""
    if first is None:
        return then

    async def on_step(step: int, metrics: Any, model: Any, backend: Any) -> None:
        await first(step, model, backend)
        if then is not None:
            then(step, metrics, model, backend)

    return on_step


def _rollforge_phases(m: dict[str, Any]) -> dict[str, float]:
    """A step's split (module docstring): the asynchronous loop records ``time/wait``, not ``time/rollout``."""
    generation = m["time/rollout"] if "time/rollout" in m else m["time/wait"]
    return {
        "generation": generation,
        "update": m["time/update"],
        "other": m["time/step"] - generation - m["time/update"],
    }
