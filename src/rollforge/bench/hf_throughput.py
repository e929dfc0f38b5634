"""HF backend throughput: policy tokens/s of rollforge rollouts vs a raw batched ``model.generate``.

Both sides get the same chat-rendered prompts, the same token budget and greedy decoding (so they
produce the same tokens), on the same model object in the same process. The raw side is one
left-padded ``model.generate`` call over all prompts, stopping rows at the end-of-turn token; its
useful tokens are those up to and including each row's end-of-turn. The rollforge side runs
single-turn episodes through the engine and the dynamic-batching HF backend. The two alternate
``repeats`` times and the best time of each is kept (the machine's noise only ever slows a run).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ..chat.render import ChatRenderer
from ..envs.base import BaseSession, Environment, Reset, Step
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..types import Sample

TOPICS = [
    "why the sky is blue",
    "how a bicycle works",
    "what a volcano is",
    "why we sleep",
    "how bees make honey",
    "what a rainbow is",
    "how rain forms",
    "why leaves change colour",
    "how a compass works",
    "what the moon is made of",
    "how plants grow",
    "why the sea is salty",
    "how a battery works",
    "what thunder is",
    "how birds fly",
    "why ice floats",
]


class _Answer(BaseSession):
    async def reset(self, sample: Sample) -> Reset:
        return Reset(prompt=sample.prompt)

    async def step(self, conversation) -> Step:
        return Step(terminated=True)


class _SingleTurn(Environment):
    max_sessions = None

    def open(self, sample: Sample) -> _Answer:
        return _Answer()


def run(
    model_name: str = "smollm2-135m", episodes: int = 16, max_new_tokens: int = 64, repeats: int = 2
) -> dict[str, Any]:
    import torch

    from ..models import load_model

    model, tokenizer = load_model(model_name)
    renderer = ChatRenderer(tokenizer)
    samples = [
        Sample(prompt=[{"role": "user", "content": f"Explain {TOPICS[i % len(TOPICS)]} in a few sentences."}])
        for i in range(episodes)
    ]
    prompts = [renderer.prompt_ids(s.prompt) + renderer.generation_prompt for s in samples]
    config = RolloutConfig(max_turns=1, greedy=True, max_new_tokens=max_new_tokens, concurrency=episodes)
    stop_ids = list(renderer.stop_token_ids)
    raw_generate(model, tokenizer, prompts, stop_ids, max_new_tokens)  # warm-up (allocations, kernels)
    raw_runs, our_runs = [], []
    for _ in range(repeats):
        raw_runs.append(raw_generate(model, tokenizer, prompts, stop_ids, max_new_tokens))
        our_runs.append(asyncio.run(rollforge_generate(model, tokenizer, renderer, samples, config)))
    (raw_tokens, raw_seconds), (our_tokens, our_seconds) = _fastest(raw_runs), _fastest(our_runs)
    return {
        "benchmark": "hf-throughput",
        "model": model_name,
        "episodes": episodes,
        "max_new_tokens": max_new_tokens,
        "torch_threads": torch.get_num_threads(),
        "raw_generate": _figures(raw_tokens, raw_seconds),
        "rollforge_hf": _figures(our_tokens, our_seconds),
        "ratio_to_raw_generate": round((our_tokens / our_seconds) / (raw_tokens / raw_seconds), 4),
    }


def raw_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], stop_ids: list[int], max_new_tokens: int
) -> tuple[int, float]:
    """The raw side: one left-padded greedy ``model.generate`` over all ``prompts``; its useful
    tokens (each row's up to and including its end-of-turn) and seconds."""
    import torch

    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, T) left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop_ids,
            pad_token_id=pad,
        )
    seconds = time.perf_counter() - started
    return sum(_useful(row[width:].tolist(), stop_ids) for row in out), seconds


async def rollforge_generate(
    model: Any, tokenizer: Any, renderer: ChatRenderer, samples: list[Sample], config: RolloutConfig
) -> tuple[int, float]:
    """rollforge's side: single-turn episodes through the engine and the dynamic-batching HF backend
    on the same model; the policy tokens generated and seconds."""
    from ..backends.hf import HFBackend
    from ..backends.settings import HFSettings

    async with HFBackend(model, tokenizer, HFSettings(max_batch_size=len(samples))) as backend:
        started = time.perf_counter()
        result = await arollout(samples, {"default": _SingleTurn()}, backend, renderer, config)
        seconds = time.perf_counter() - started
    return sum(t.generated_tokens for t in result.trajectories), seconds


def _fastest(runs: list[tuple[int, float]]) -> tuple[int, float]:
    """The fastest of a side's ``(tokens, seconds)`` runs (the machine's noise only ever slows a run)."""
    return min(runs, key=lambda r: r[1])


def _figures(tokens: int, seconds: float) -> dict[str, Any]:
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_second": round(tokens / seconds, 2)}


def _useful(row: list[int], stop_ids: list[int]) -> int:
    for i, token in enumerate(row):
        if token in stop_ids:
            return i + 1
    return len(row)


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run(), indent=2))


def add_arguments(parser: Any) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="alternating measurements of each side")


def main(args: Any) -> dict[str, Any]:
    return run(args.model, args.episodes, args.max_new_tokens, args.repeats)
