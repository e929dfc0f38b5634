"""vLLM backend throughput: policy tokens/s of multi-turn rollouts vs vLLM's own ``LLM.generate``.

The work: ``episodes`` conversations of ``turns`` assistant turns each (after each reply the
environment asks for one more sentence), ``max_new_tokens`` per turn, greedy decoding, stopping at
the end-of-turn token, in rollforge's async mode.

- rollforge side: ``arollout`` through ``VLLMBackend``; every request it sends is recorded (prompt
  ids, sampling parameters, seed) with its turn.
- raw side: vLLM's ``LLM.generate`` replays exactly those requests (same ids, same vLLM sampling
  parameters, logprobs included), one call per turn, each call holding every episode's request of
  that turn. A turn's prompts contain the previous turn's replies, so no engine can batch beyond a
  turn; the raw side is the engine alone, with no chat rendering, environments or asyncio.
- ``ratio_to_raw_vllm`` = rollforge tokens/s ÷ raw tokens/s. Both engines are built with the same
  options in this process; the two sides alternate ``repeats`` times on fresh prompts (no prefix
  cache carries over between repetitions) and the best time of each is kept.
- The HF backend runs the same episodes once, for comparison (``rollforge_hf``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Sequence

from ..backends.base import SamplingParams
from ..chat.render import ChatRenderer
from ..envs.base import BaseSession, Environment, Reset, Step
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..types import Completion, Message, Sample
from .hf_throughput import TOPICS

MORE = "Go on, in one more sentence."


class _Continue(BaseSession):
    async def reset(self, sample: Sample) -> Reset:
        return Reset(prompt=sample.prompt)

    async def step(self, conversation) -> Step:
        return Step(messages=(Message("user", MORE),))


class _Conversation(Environment):
    max_sessions = None

    def open(self, sample: Sample) -> _Continue:
        return _Continue()


class _Recorder:
    """Wraps a backend; keeps (prompt ids, params, completion) of every request."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.requests: list[tuple[list[int], SamplingParams, Completion]] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        completion = await self.inner.generate(prompt_ids, params)
        self.requests.append((list(prompt_ids), params, completion))
        return completion

    async def close(self) -> None:
        pass


def _samples(episodes: int, repetition: int) -> list[Sample]:
    return [
        Sample(prompt=[{"role": "user", "content": f"({repetition}.{i}) Explain {TOPICS[i % len(TOPICS)]}."}])
        for i in range(episodes)
    ]


def run(
    model_name: str = "smollm2-135m", episodes: int = 32, turns: int = 2, max_new_tokens: int = 32,
    repeats: int = 2, eager: bool | None = None, dtype: str = "float32", with_hf: bool = True,
) -> dict[str, Any]:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON result
    import vllm

    from ..backends.vllm import VLLMBackend, default_enforce_eager, vllm_sampling_params
    from ..models import load_tokenizer, resolve_model

    path = resolve_model(model_name)
    renderer = ChatRenderer(load_tokenizer(path))
    config = RolloutConfig(max_turns=turns, greedy=True, max_new_tokens=max_new_tokens, concurrency=episodes)
    environments = {"default": _Conversation()}
    eager = default_enforce_eager() if eager is None else eager
    common = dict(dtype=dtype, seed=0, max_num_seqs=episodes, enforce_eager=eager)
    backend = VLLMBackend(path, kv_cache_gib=1.0, **common)
    raw = vllm.LLM(
        model=str(path), logprobs_mode="raw_logprobs", enable_prefix_caching=True, kv_cache_memory_bytes=2**30,
        disable_log_stats=True, **common,
    )
    generation_prompt = list(renderer.generation_prompt)

    def turn_of(ids: list[int]) -> int:  # generation prompts in the prompt = turns so far + 1
        n = len(generation_prompt)
        return sum(ids[i : i + n] == generation_prompt for i in range(len(ids) - n + 1))

    def ours(repetition: int) -> tuple[int, float, list]:
        recorder = _Recorder(backend)
        started = time.perf_counter()
        result = asyncio.run(arollout(_samples(episodes, repetition), environments, recorder, renderer, config))
        seconds = time.perf_counter() - started
        errors = [t.error for t in result.trajectories if t.error]
        if errors:
            raise RuntimeError(f"{len(errors)} episodes failed on the vLLM backend; first: {errors[0]}")
        return sum(t.generated_tokens for t in result.trajectories), seconds, recorder.requests

    def replay(requests: list) -> tuple[int, float]:
        waves: dict[int, list] = {}
        for ids, params, _ in requests:
            waves.setdefault(turn_of(ids), []).append((ids, params))
        started = time.perf_counter()
        tokens = 0
        for turn in sorted(waves):
            prompts = [vllm.TokensPrompt(prompt_token_ids=ids) for ids, _ in waves[turn]]
            sampling = [vllm_sampling_params(params, params.seed or 0) for _, params in waves[turn]]
            outputs = raw.generate(prompts, sampling, use_tqdm=False)
            tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
        return tokens, time.perf_counter() - started

    try:
        _, _, warm = ours(-1)  # warm-up of both engines
        replay(warm)
        our_runs, raw_runs = [], []
        for repetition in range(repeats):
            tokens, seconds, requests = ours(repetition)
            our_runs.append((tokens, seconds, len(requests)))
            raw_runs.append(replay(requests))
    finally:
        asyncio.run(backend.close())
        raw.llm_engine.engine_core.shutdown()
    our_tokens, our_seconds, n_requests = min(our_runs, key=lambda r: r[1])
    raw_tokens, raw_seconds = min(raw_runs, key=lambda r: r[1])
    our_tps, raw_tps = our_tokens / our_seconds, raw_tokens / raw_seconds
    result: dict[str, Any] = {
        "benchmark": "vllm-throughput",
        "model": model_name,
        "episodes": episodes,
        "turns": turns,
        "max_new_tokens": max_new_tokens,
        "requests": n_requests,
        "dtype": dtype,
        "enforce_eager": eager,
        "raw_vllm": _side(raw_tokens, raw_seconds),
        "rollforge_vllm": _side(our_tokens, our_seconds),
        "ratio_to_raw_vllm": round(our_tps / raw_tps, 4),
    }
    if with_hf:
        result["rollforge_hf"] = _hf_side(path, renderer, config, environments, episodes)
        result["ratio_hf_to_raw_vllm"] = round(result["rollforge_hf"]["tokens_per_second"] / raw_tps, 4)
    return result


def _side(tokens: int, seconds: float) -> dict[str, Any]:
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_second": round(tokens / seconds, 2)}


def _hf_side(path, renderer, config, environments, episodes: int) -> dict[str, Any]:
    from ..backends.hf import HFBackend
    from ..models import load_model

    model, tokenizer = load_model(path)

    async def run() -> tuple[Any, float]:
        async with HFBackend(model, tokenizer, max_batch_size=episodes) as backend:
            started = time.perf_counter()
            result = await arollout(_samples(episodes, 0), environments, backend, renderer, config)
            return result, time.perf_counter() - started

    result, seconds = asyncio.run(run())
    return _side(sum(t.generated_tokens for t in result.trajectories), seconds)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="alternating measurements of each side")
    parser.add_argument("--compile", dest="eager", action="store_false", default=None,
                        help="torch.compile the model in vLLM (default on GPU; on CPU eager is the default)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-hf", action="store_true", help="skip the HF backend comparison")


def main(args: Any) -> dict[str, Any]:
    return run(
        args.model, args.episodes, args.turns, args.max_new_tokens, args.repeats, args.eager, args.dtype, not args.no_hf
    )


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run(), indent=2))
