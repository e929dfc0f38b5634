"""The two sides of ``rollforge bench vs-trl``: a TRL ``GRPOTrainer`` run, a rollforge ``train`` run,
each returning per-step seconds, rewards and work counts, and ``Turns``, which makes the two take
strictly alternating steps when they run together (see ``vs_trl``'s docstring for the settings)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import RollforgeError
from .vs_trl_env import GuessNumber

ENV_NAME = "rollforge.bench.vs_trl_env:GuessNumber"


# -- alternation -----------------------------------------------------------------------------------


class Turns:
    """TRL (this thread) and rollforge (another thread) take strictly alternating training steps, TRL
    first, so that load from other processes falls on both alike and their work never overlaps.

    TRL waits in ``on_step_begin`` (before its clock starts) and hands over in ``on_step_end``.
    Rollforge has no step hook, so its ``arollout`` is wrapped: entering the rollout of step k means
    step k - 1 is complete; it hands over there and waits. That wait lies inside rollforge's
    ``time/rollout``; it is measured per step and subtracted."""

    def __init__(self):
        self.trl_turn, self.rollforge_turn, self.rollforge_done = (threading.Event() for _ in range(3))
        self.trl_ready = threading.Event()  # transformers' model loading is not thread-safe: one at a time
        self.failed = False

    def wait(self, event: threading.Event) -> None:
        while not event.wait(1.0):
            if self.failed:
                raise RollforgeError("the other trainer of the comparison failed (its error follows)")
        event.clear()

    @contextlib.contextmanager
    def gate_rollforge(self):
        from ..train import loop

        real = loop.arollout
        waited: list[float] = []

        async def gated(*args, **kwargs):
            began = time.perf_counter()
            self.trl_turn.set()
            self.wait(self.rollforge_turn)
            waited.append(time.perf_counter() - began)
            return await real(*args, **kwargs)

        loop.arollout = gated
        try:
            yield waited
        finally:
            loop.arollout = real


def run_alternating(model_dir: Path, rows: list[dict[str, Any]], s: dict[str, Any], out: Path):
    turns = Turns()
    outcome: dict[str, Any] = {}

    def rollforge_side():
        try:
            turns.wait(turns.trl_ready)
            outcome["run"] = run_rollforge(model_dir, rows, s, out / "rollforge", turns)
        except BaseException as exc:  # handed to the main thread, which re-raises it
            outcome["error"] = exc
            turns.failed = True
        finally:
            turns.rollforge_done.set()

    thread = threading.Thread(target=rollforge_side, name="rollforge-trainer", daemon=True)
    thread.start()
    try:
        trl_run = run_trl(model_dir, rows, s, out / "trl", turns)
    except BaseException as exc:
        turns.failed = True
        thread.join()
        if "error" in outcome:  # rollforge failed first; TRL only stopped waiting for it
            raise outcome["error"] from exc
        raise
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return trl_run, outcome["run"]


# -- TRL -------------------------------------------------------------------------------------------


def run_trl(
    model_dir: Path, rows: list[dict[str, Any]], s: dict[str, Any], out: Path, turns: "Turns | None" = None
) -> dict[str, Any]:
    import os

    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    class Clock(TrainerCallback):
        def __init__(self):
            self.step_seconds: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if turns is not None:
                turns.wait(turns.trl_turn)
            self.began = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_seconds.append(time.perf_counter() - self.began)
            if turns is not None:
                turns.rollforge_turn.set()
                if state.global_step == args.max_steps:
                    turns.wait(turns.rollforge_done)  # its last step runs now; nothing of TRL's may overlap it

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs.append(dict(logs))

    n = s["batch_size"] * s["generations"]
    config = GRPOConfig(
        output_dir=str(out), max_steps=s["steps"], seed=s["seed"], per_device_train_batch_size=n,
        gradient_accumulation_steps=1, num_generations=s["generations"], max_completion_length=s["max_completion_tokens"],
        max_tool_calling_iterations=s["max_tool_calls"], learning_rate=s["lr"], lr_scheduler_type="constant",
        warmup_steps=0, adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
        epsilon=0.2, loss_type="dapo", scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0,
        bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )
    clock = Clock()
    trainer = GRPOTrainer(
        model=model, args=config, train_dataset=datasets.Dataset.from_list(rows), processing_class=tokenizer,
        environment_factory=GuessNumber, callbacks=[clock],
    )
    if turns is not None:
        turns.trl_ready.set()
    prompt = tokenizer.apply_chat_template(rows[0]["prompt"], tools=trainer._env_tools[None], add_generation_prompt=True)
    rollout_seconds, context_tokens = _instrument_trl(trainer)
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for the JSON
        trainer.train()
    run_seconds = time.perf_counter() - started
    steps = [
        {
            "reward": log["reward"],
            "generated_tokens": log["completions/mean_length"] * n,
            "tool_calls": log.get("tools/call_frequency", 0.0) * n,
            "tool_failures": log.get("tools/failure_frequency", 0.0) * log.get("tools/call_frequency", 0.0) * n,
        }
        for log in clock.logs
    ]
    for step, seconds, tokens in zip(steps, rollout_seconds, context_tokens):
        step["assistant_turns"] = step["tool_calls"] + n  # each episode's last generation calls no tool
        step["rollout_seconds"] = seconds
        step["context_tokens"] = tokens
    return {
        "step_seconds": clock.step_seconds, "steps": steps, "rewards": [round(x["reward"], 4) for x in steps],
        "run_seconds": run_seconds, "prompt_tokens": len(_ids(prompt)),
    }


def _instrument_trl(trainer: Any) -> tuple[list[float], list[int]]:
    """Per step: seconds in ``_generate`` (generation and tool calls) and the context tokens handed to
    ``model.generate`` (every turn re-reads its whole history). Wraps two methods of this instance."""
    rollout_seconds: list[float] = []
    context_tokens: list[int] = []
    generate, single_turn = trainer._generate, trainer._generate_single_turn

    def timed_generate(*args, **kwargs):
        context_tokens.append(0)
        began = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            rollout_seconds.append(time.perf_counter() - began)

    def counted_single_turn(prompt_ids, *args, **kwargs):
        context_tokens[-1] += sum(len(ids) for ids in prompt_ids)
        return single_turn(prompt_ids, *args, **kwargs)

    trainer._generate, trainer._generate_single_turn = timed_generate, counted_single_turn
    return rollout_seconds, context_tokens


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


# -- rollforge -------------------------------------------------------------------------------------


def run_rollforge(
    model_dir: Path, rows: list[dict[str, Any]], s: dict[str, Any], out: Path, turns: "Turns | None" = None
) -> dict[str, Any]:
    from ..chat.render import ChatRenderer
    from ..envs.tools import discover_tools
    from ..models import load_model
    from ..train.config import load_config
    from ..train.loop import train
    from ..types import Message

    _, tokenizer = load_model(model_dir)
    tools = tuple(t.schema() for t in discover_tools(GuessNumber()).values())
    prompt = [Message(m["role"], m["content"]) for m in rows[0]["prompt"]]
    renderer = ChatRenderer(tokenizer)
    prompt_tokens = len(renderer.prompt_ids(prompt, tools) + renderer.generation_prompt)
    n = s["batch_size"] * s["generations"]
    config = load_config(
        out=str(out), steps=s["steps"], seed=s["seed"], checkpoint_every=0, save_trajectories=False,
        model={"name": str(model_dir), "dtype": "float32", "backend": "hf"},
        environments=[{"name": ENV_NAME, "task_name": "guess"}],
        algorithm={
            "batch_size": s["batch_size"], "group_size": s["generations"], "advantage": "grpo",
            "loss_aggregation": "token", "clip_low": 0.2, "clip_high": 0.2, "kl_beta": 0.0, "epochs_per_batch": 1,
        },
        optim={
            "lr": s["lr"], "betas": [0.9, 0.999], "weight_decay": 0.0, "schedule": "constant", "warmup_steps": 0,
            "max_grad_norm": 1.0,
        },
        rollout={
            "mode": s.get("rollforge_mode", "async"), "max_turns": s["max_tool_calls"] + 1, "max_new_tokens": s["max_completion_tokens"],
            "max_seq_len": prompt_tokens + s["max_completion_tokens"], "temperature": 1.0, "concurrency": n,
            "seed": s["seed"],
        },
    )
    started = time.perf_counter()
    if turns is None:
        result = train(config, dataset=rows, console=False)
        waited = [0.0] * s["steps"]
    else:
        with turns.gate_rollforge() as waited:
            result = train(config, dataset=rows, console=False)
    run_seconds = time.perf_counter() - started
    steps = [
        {
            "reward": m["reward/mean"],
            "generated_tokens": m["rollout/mean_gen_tokens_per_sample"] * n,
            "assistant_turns": m["rollout/total_turns"],
            "tool_calls": m["rollout/total_turns"] - n,  # every episode's last turn answers without a call
            "rollout_seconds": m["time/rollout"] - w,
            "context_tokens": None,
            "tool_failures": sum(v for k, v in m.items() if k.startswith("rollout/failures/")),
        }
        for m, w in zip(result.history, waited)
    ]
    return {
        "step_seconds": [m["time/step"] - w for m, w in zip(result.history, waited)], "steps": steps,
        "rewards": [round(x["reward"], 4) for x in steps], "run_seconds": run_seconds, "prompt_tokens": prompt_tokens,
    }
