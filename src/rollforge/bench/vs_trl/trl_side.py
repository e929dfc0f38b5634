"""TRL's side of ``rollforge bench vs-trl``: a ``GRPOTrainer`` run with the comparison's settings,
returning per-step seconds (with where they went), rewards and work counts (``vs_trl.runners``
runs it, alone or alternating with rollforge's side).

The trainer is configured from the settings ``s`` as ``vs_trl.runners``' docstring says (one
generation of ``n`` completions and one optimizer step per step, ``trl_micro_batch`` completions
per loss forward; ``model.generate`` or, with ``trl_vllm``, a colocated vLLM engine), and lists an
environment's tools in the class's order, as rollforge does.

``StepClock``, a ``TrainerCallback``, times each step from ``on_step_begin`` to ``on_step_end``
and splits it: ``generation`` is ``_generate`` (prompt tokenizing, ``model.generate``, tool calls);
``update`` is ``training_step`` (summed over the step's micro-batches) less its ``_prepare_inputs``
(the loss forwards and backwards) plus what follows up to ``on_step_end`` (gradient clipping,
optimizer and scheduler steps); ``other`` is the rest, mostly ``_prepare_inputs`` less
``_generate`` (rewards, advantages, padding). It also counts, per step, the context tokens handed
to ``model.generate`` (every turn re-reads its history), and takes turns with rollforge's side
through ``Turns`` when the two alternate.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .settings import Settings
from .workloads import Workload

if TYPE_CHECKING:
    from .runners import Turns


def run_trl(
    workload: Workload, s: Settings, out: Path, turns: "Turns | None" = None, after_step: Any = None
) -> dict[str, Any]:
    """``after_step(step, model)``: called after each step's clock stopped, before TRL hands over."""
    import os

    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    tokenizer = AutoTokenizer.from_pretrained(workload.model_dir)
    model = AutoModelForCausalLM.from_pretrained(workload.model_dir, dtype=torch.float32)
    clock = trl_clock(turns, after_step)
    n = s.completions
    config = _grpo_config(workload, s, out, n)
    trainer = GRPOTrainer(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_list(workload.rows),
        processing_class=tokenizer,
        reward_funcs=workload.trl_reward_funcs or None,
        environment_factory=workload.trl_environment_factory,
        callbacks=[clock],
    )
    if workload.multi_turn:
        _in_workload_order(trainer, workload)
    tools = trainer._env_tools[None] if workload.multi_turn else None
    prompt = tokenizer.apply_chat_template(workload.rows[0]["prompt"], tools=tools, add_generation_prompt=True)
    clock.instrument(trainer)
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for the JSON
        trainer.train()
    run_seconds = time.perf_counter() - started
    steps = _steps(clock, n)
    return {
        "step_seconds": clock.step_seconds,
        "steps": steps,
        "rewards": [round(x["reward"], 4) for x in steps],
        "run_seconds": run_seconds,
        "prompt_tokens": len(_ids(prompt)),
        "configuration": {
            "generation": "vllm colocate" if trainer.use_vllm else "model.generate",
            "sampling": sampling_settings(trainer.generation_config if not trainer.use_vllm else config),
        },
    }


def _grpo_config(workload: Workload, s: Settings, out: Path, n: int) -> Any:
    """TRL's ``GRPOConfig`` for the comparison's settings ``s`` (``vs_trl.runners``' docstring):
    ``n`` completions per step in one generation, ``trl_micro_batch`` of them per loss forward."""
    from trl import GRPOConfig

    cuda = s.device == "cuda"  # bench gpu: CUDA, float32 master weights, bfloat16 autocast
    micro = math.gcd(n, s.trl_micro_batch or n)  # one generation of n, then n // micro loss forwards
    return GRPOConfig(
        output_dir=str(out),
        max_steps=s.steps,
        seed=s.seed,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=n // micro,
        num_generations=s.generations,
        max_completion_length=s.max_completion_tokens,
        max_tool_calling_iterations=s.max_tool_calls if workload.multi_turn else None,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        bf16=s.dtype == "bfloat16",
        fp16=False,
        use_cpu=not cuda,
        gradient_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        shuffle_dataset=s.shuffle,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False} if s.trl_vllm else {}),
    )


def _steps(clock: StepClock, n: int) -> list[dict[str, Any]]:
    """Each step's reward and work counts, from the logs the clock kept (TRL logs frequencies per
    completion; ``n`` completions a step)."""
    steps = []
    for log, phases, tokens in zip(clock.logs, clock.phases, clock.context_tokens):
        calls = log.get("tools/call_frequency", 0.0) * n
        steps.append(
            {
                "reward": log["reward"],
                "generated_tokens": log["completions/mean_length"] * n,
                "tool_calls": calls,
                "tool_failures": log.get("tools/failure_frequency", 0.0) * calls,
                "assistant_turns": calls + n,  # each episode's last generation calls no tool
                "phases": phases,
                "context_tokens": tokens,
            }
        )
    return steps


def _in_workload_order(trainer: Any, workload: Workload) -> None:
    """TRL lists an environment's tools alphabetically; rollforge in the class's order. TRL gets
    rollforge's order, so that both render the same prompt (the one a warm-up was trained on)."""
    from ...envs.tools import class_tools

    order = [name for factory in workload.tools for name in class_tools(factory)]
    for key, tools in trainer._env_tools.items():
        trainer._env_tools[key] = sorted(
            tools, key=lambda t: order.index(t.__name__) if t.__name__ in order else len(order)
        )


def sampling_settings(config: Any) -> dict[str, Any]:
    """The sampling settings a side generates with (TRL's ``GenerationConfig``, rollforge's rollout config)."""
    return {key: getattr(config, key, None) for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}


class StepClock:
    """Records step times (``on_step_begin`` -> ``on_step_end``), their phases (module docstring),
    the logs and each step's context tokens; ``instrument(trainer)`` wraps the methods it times.
    With ``turns``, waits for TRL's turn before a step and hands over after it; ``after_step(step,
    model)`` runs after each step's clock stopped. ``trl_clock`` makes it a ``TrainerCallback``."""

    def __init__(self, turns: "Turns | None" = None, after_step: Any = None):
        self.turns, self.after_step = turns, after_step
        self.step_seconds: list[float] = []
        self.phases: list[dict[str, float]] = []
        self.logs: list[dict[str, float]] = []
        self.context_tokens: list[int] = []
        self.spent = {"generate": 0.0, "prepare": 0.0, "train": 0.0}

    def on_step_begin(self, args, state, control, **kwargs):
        if self.turns is not None:
            self.turns.wait(self.turns.trl_turn)
        self.began = time.perf_counter()
        self.spent = {"generate": 0.0, "prepare": 0.0, "train": 0.0}
        self.context_tokens.append(0)

    def on_step_end(self, args, state, control, **kwargs):
        ended = time.perf_counter()
        step = ended - self.began
        update = self.spent["train"] - self.spent["prepare"] + (ended - self.trained)
        self.step_seconds.append(step)
        self.phases.append(
            {"generation": self.spent["generate"], "update": update, "other": step - self.spent["generate"] - update}
        )
        if self.after_step is not None:
            self.after_step(state.global_step, kwargs["model"])
        if self.turns is not None:
            self.turns.rollforge_turn.set()
            if state.global_step == args.max_steps:
                self.turns.wait(self.turns.rollforge_done)  # its last step runs now; nothing of TRL's may overlap it

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.logs.append(dict(logs))

    def instrument(self, trainer: Any) -> None:
        generate, prepare, training_step = trainer._generate, trainer._prepare_inputs, trainer.training_step
        single_turn = trainer._generate_single_turn

        def timed_training_step(*args, **kwargs):  # once per micro-batch
            began = time.perf_counter()
            try:
                return training_step(*args, **kwargs)
            finally:
                self.trained = time.perf_counter()
                self.spent["train"] += self.trained - began

        def counted_single_turn(prompt_ids, *args, **kwargs):
            self.context_tokens[-1] += sum(len(ids) for ids in prompt_ids)
            return single_turn(prompt_ids, *args, **kwargs)

        trainer._generate = _timed(generate, self, "generate")
        trainer._prepare_inputs = _timed(prepare, self, "prepare")
        trainer.training_step, trainer._generate_single_turn = timed_training_step, counted_single_turn


def trl_clock(turns: "Turns | None", after_step: Any = None) -> StepClock:
    """A ``StepClock`` that is also a ``TrainerCallback`` (transformers is imported only here)."""
    from transformers import TrainerCallback

    class Clock(StepClock, TrainerCallback):
        pass

    return Clock(turns, after_step)


def _timed(function: Any, clock: StepClock, key: str) -> Any:
    """``function``, adding the seconds each call takes to ``clock.spent[key]`` (read at call time:
    the clock starts a fresh ``spent`` every step)."""

    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            clock.spent[key] += time.perf_counter() - began

    return wrapper


def _ids(encoded: Any) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
