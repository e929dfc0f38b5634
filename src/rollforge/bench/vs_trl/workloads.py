"""The two workloads of ``rollforge bench vs-trl``: what each trainer is given to train on.

- ``arithmetic`` (the default, real work): SmolLM2-135M-Instruct (``smollm2-135m``) answers
  single-turn one-digit additions ("What is 3 + 4? Answer with just the number."). TRL gets a reward
  function, rollforge its bundled ``arithmetic`` environment; both score with the same
  ``score_answer`` (1 when the last number in the reply is the sum). No tools, one turn.
- ``calculator`` (``rollforge bench learning``'s): a warmed-up SmolLM2 checkpoint plays the
  bundled ``calculator`` environment on the quickstart's operations (``plus``, ``times``: tools
  ``add``, ``multiply``, ``answer``). Rollforge runs the bundled environment unchanged (the rows'
  ``environment`` column picks its class); TRL runs that same class as its
  ``environment_factory``. TRL ignores ``done`` (it runs every call of a message and generates one
  more turn after the last tool result); with ``closing`` the episode ends that way on both sides
  (compute, answer, then a reply without a tool call), and the class refuses every call after
  ``answer`` (``calculator.EPISODE_OVER``), so the reward (``get_reward``) is the one rollforge gives. The model directory must carry TRL's Qwen2.5 template
  (``learning.sides.templated``): TRL parses tool calls only for templates it knows.
- ``guess-number``: the warmed-up 0.9M-parameter tool-caller of ``vs_trl.model`` playing
  ``vs_trl.env.GuessNumber`` through TRL's ``environment_factory`` (multi-turn, tool calls): fast,
  for tests and for comparing the frameworks' per-turn overhead.

A ``Workload`` holds what differs between them; everything else (algorithm, optimizer, limits,
alternation) is the same for both and lives in ``vs_trl.runners``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...envs.library.arithmetic import samples as arithmetic_samples
from ...envs.library.arithmetic import score_answer
from ...envs.library.calculator import build as build_calculator
from ...envs.library.calculator import samples as calculator_samples
from .env import MAX_TOOL_CALLS, GuessNumber, prompt_rows

GUESS_NUMBER_ENV = "rollforge.bench.vs_trl.env:GuessNumber"


@dataclass(frozen=True)
class Workload:
    name: str
    model_dir: Path
    rows: list[dict[str, Any]]  # dataset rows both trainers read: a "prompt" message list and task columns
    rollforge_environment: dict[str, Any]  # one entry of the training config's ``environments``
    trl_reward_funcs: list[Callable[..., list[float]]] = field(default_factory=list)
    trl_environment_factory: Any = None
    tools: tuple[Any, ...] = ()  # the tool methods rollforge renders into the prompt (TRL finds its own)
    defaults: dict[str, Any] = field(default_factory=dict)  # settings this workload runs with unless told

    @property
    def multi_turn(self) -> bool:
        return self.trl_environment_factory is not None


#: Per workload: settings the CLI uses when a flag is not given.
DEFAULTS = {
    "arithmetic": {
        "batch_size": 2,
        "generations": 4,
        "max_completion_tokens": 32,
        "max_tool_calls": 0,
        "lr": 1e-6,
        "steps": 6,
    },
    "guess-number": {
        "batch_size": 4,
        "generations": 4,
        "max_completion_tokens": 128,
        "max_tool_calls": MAX_TOOL_CALLS,
        "lr": 5e-4,
        "steps": 8,
    },
}


def arithmetic_reward(completions: list[list[dict[str, str]]], metadata: list[dict[str, Any]], **_: Any) -> list[float]:
    """TRL's reward function for ``arithmetic``: rollforge's environment scores with the same rule."""
    return [score_answer(c[-1]["content"], int(m["answer"])) for c, m in zip(completions, metadata)]


def arithmetic(model: str | Path = "smollm2-135m", rows: int = 64, seed: int = 0) -> Workload:
    from ...models import resolve_model

    rendered = [
        {"prompt": [{"role": m.role, "content": m.content} for m in s.prompt], "metadata": s.row["metadata"]}
        for s in arithmetic_samples(rows, seed)
    ]
    return Workload(
        name="arithmetic",
        model_dir=resolve_model(model),
        rows=rendered,
        rollforge_environment={"name": "arithmetic", "task_name": "arithmetic"},
        trl_reward_funcs=[arithmetic_reward],
        defaults=DEFAULTS["arithmetic"],
    )


def message_rows(samples: list[Any]) -> list[dict[str, Any]]:
    """Dataset rows of ``Sample``s: the prompt as a message list, then the row's columns."""
    return [{"prompt": [{"role": m.role, "content": m.content} for m in s.prompt], **s.row} for s in samples]


def calculator(
    model_dir: Path,
    operations: Sequence[str] = ("plus", "times"),
    rows: int = 64,
    seed: int = 0,
    balanced: bool = False,
    closing: bool = False,
) -> Workload:
    """``model_dir``: a checkpoint that knows the call format, with TRL's Qwen2.5 template;
    ``balanced``: the quickstart's prompts (``calculator.samples``), each block of four asking both
    operations with both tools' operands; ``closing``: the episode ends with a reply after
    ``answer`` on both sides (the turn TRL's loop generates after the last tool result)."""
    samples = calculator_samples(rows, seed, operations=list(operations), balanced=balanced, closing=closing)
    environment = build_calculator().factory[samples[0].row["environment"]]  # the class these rows route to
    return Workload(
        name="calculator",
        model_dir=Path(model_dir),
        rows=message_rows(samples),
        rollforge_environment={"name": "calculator"},
        trl_environment_factory=environment,
        tools=(environment,),
    )


def guess_number(seed: int = 0, model_dir: Path | None = None) -> Workload:
    """``model_dir``: the tool-caller to use (default: ``vs_trl.model.prepare_model()``'s)."""
    from .model import prepare_model

    return Workload(
        name="guess-number",
        model_dir=model_dir or prepare_model(),
        rows=prompt_rows(64, seed),
        rollforge_environment={"name": GUESS_NUMBER_ENV, "task_name": "guess"},
        trl_environment_factory=GuessNumber,
        tools=(GuessNumber,),
        defaults=DEFAULTS["guess-number"],
    )
