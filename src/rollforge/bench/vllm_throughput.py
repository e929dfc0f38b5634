"""vLLM backend throughput: policy tokens/s of multi-turn rollouts vs vLLM's own ``generate``.

The work: ``episodes`` conversations of ``turns`` assistant turns each (after each reply the
environment asks for one more sentence), ``max_new_tokens`` per turn, greedy decoding, stopping at
the end-of-turn token, in rollforge's async mode.

- rollforge side: ``arollout`` through ``VLLMBackend``, wrapped in a ``RecordingBackend`` that keeps
  every request it sends (prompt ids, sampling parameters, seed) with its episode.
- raw side: vLLM's own ``AsyncLLM.generate``, on the same engine, replays exactly those requests
  (same ids, same vLLM sampling parameters, logprobs included), one wave per turn, each wave holding
  every episode's request of that turn, all submitted at once. A turn's prompts contain the previous
  turn's replies, so no engine can batch beyond a turn; the raw side is the engine alone, with no
  chat rendering, environments or rollforge backend.
- One engine serves both sides (one load of vLLM): the prefix cache is emptied before each side's
  run, so neither reuses the other's prefill. The sides alternate ``repeats`` times on fresh
  prompts and the best time of each is kept. ``ratio_to_raw_vllm`` = rollforge tokens/s ÷ raw
  tokens/s.
- The HF backend runs the same episodes once, for comparison (``rollforge_hf``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from typing import Any

from ..chat.render import ChatRenderer
from ..envs.base import BaseSession, Environment, Reset, Step
from ..rollout.config import RolloutConfig
from ..rollout.engine import arollout
from ..types import Message, Sample
from ..testing import RecordingBackend, Request
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


def _samples(episodes: int, repetition: int) -> list[Sample]:
    return [
        Sample(prompt=[{"role": "user", "content": f"({repetition}.{i}) Explain {TOPICS[i % len(TOPICS)]}."}])
        for i in range(episodes)
    ]


def run(
    model_name: str = "smollm2-135m",
    episodes: int = 32,
    turns: int = 2,
    max_new_tokens: int = 32,
    repeats: int = 2,
    eager: bool | None = None,
    dtype: str = "float32",
    with_hf: bool = True,
) -> dict[str, Any]:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON result
    from ..backends.settings import VLLMSettings
    from ..backends.vllm import VLLMBackend
    from ..backends.vllm_engine import default_enforce_eager
    from ..models import load_tokenizer, resolve_model

    path = resolve_model(model_name)
    renderer = ChatRenderer(load_tokenizer(path))
    config = RolloutConfig(max_turns=turns, greedy=True, max_new_tokens=max_new_tokens, concurrency=episodes)
    eager = default_enforce_eager() if eager is None else eager
    settings = VLLMSettings(dtype=dtype, seed=0, max_num_seqs=episodes, enforce_eager=eager, kv_cache_gib=1.0)
    backend = VLLMBackend(path, settings)
    try:
        ours(backend, renderer, config, -1)  # warm-up
        our_runs, raw_runs = [], []
        for repetition in range(repeats):
            tokens, seconds, requests = ours(backend, renderer, config, repetition)
            our_runs.append((tokens, seconds, len(requests.requests)))
            raw_runs.append(replay(backend, requests.per_episode()))
    finally:
        asyncio.run(backend.close())
    our_tokens, our_seconds, n_requests = min(our_runs, key=lambda r: r[1])
    raw_tokens, raw_seconds = min(raw_runs, key=lambda r: r[1])
    raw_tps = raw_tokens / raw_seconds
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
        "ratio_to_raw_vllm": round(our_tokens / our_seconds / raw_tps, 4),
    }
    if with_hf:
        result["rollforge_hf"] = _hf_side(path, renderer, config)
        result["ratio_hf_to_raw_vllm"] = round(result["rollforge_hf"]["tokens_per_second"] / raw_tps, 4)
    return result


def ours(
    backend: Any, renderer: ChatRenderer, config: RolloutConfig, repetition: int
) -> tuple[int, float, RecordingBackend]:
    """One rollforge run on fresh prompts: (policy tokens, seconds, the recorded requests)."""
    _on_engine(backend, backend._engine.reset_prefix_cache())
    recorder = RecordingBackend(backend)
    samples = _samples(config.concurrency, repetition)
    started = time.perf_counter()
    result = asyncio.run(arollout(samples, {"default": _Conversation()}, recorder, renderer, config))
    seconds = time.perf_counter() - started
    errors = [t.error for t in result.trajectories if t.error]
    if errors:
        raise RuntimeError(f"{len(errors)} episodes failed on the vLLM backend; first: {errors[0]}")
    return sum(t.generated_tokens for t in result.trajectories), seconds, recorder


def replay(backend: Any, episodes: list[list[Request]]) -> tuple[int, float]:
    """The recorded requests through vLLM's ``AsyncLLM.generate`` on the backend's own engine, turn
    by turn (wave ``i``: every episode's ``i``-th request, all at once): (tokens, seconds)."""
    from ..backends.vllm_engine import vllm_sampling_params

    waves = [[e[i] for e in episodes if i < len(e)] for i in range(max(map(len, episodes), default=0))]

    async def one(engine: Any, request: Request) -> int:
        final = None
        prompt = {"prompt_token_ids": list(request.prompt_ids)}
        params = vllm_sampling_params(request.params, request.params.seed or 0)
        async for final in engine.generate(prompt, params, f"raw-{next(_RAW_IDS)}"):
            pass
        return len(final.outputs[0].token_ids)

    async def all_waves() -> tuple[int, float]:
        engine = backend._engine
        await engine.reset_prefix_cache()
        started, tokens = time.perf_counter(), 0
        for wave in waves:
            tokens += sum(await asyncio.gather(*(one(engine, r) for r in wave)))
        return tokens, time.perf_counter() - started

    return _on_engine(backend, all_waves())


def _on_engine(backend: Any, coroutine: Any) -> Any:
    """Run ``coroutine`` on the loop of the backend's engine (an ``AsyncLLM`` serves only the event
    loop that first used it) and return its result. The bench reaches into ``VLLMBackend`` here so
    that both sides share one engine: a second engine would load vLLM twice."""
    return backend._thread.call(coroutine, None)


_RAW_IDS = itertools.count()


def _side(tokens: int, seconds: float) -> dict[str, Any]:
    return {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_second": round(tokens / seconds, 2)}


def _hf_side(path, renderer: ChatRenderer, config: RolloutConfig) -> dict[str, Any]:
    from ..backends.hf import HFBackend
    from ..backends.settings import HFSettings
    from ..models import load_model

    model, tokenizer = load_model(path)

    async def run() -> tuple[Any, float]:
        async with HFBackend(model, tokenizer, HFSettings(max_batch_size=config.concurrency)) as backend:
            started = time.perf_counter()
            result = await arollout(
                _samples(config.concurrency, 0), {"default": _Conversation()}, backend, renderer, config
            )
            return result, time.perf_counter() - started

    result, seconds = asyncio.run(run())
    return _side(sum(t.generated_tokens for t in result.trajectories), seconds)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="alternating measurements of each side")
    parser.add_argument(
        "--compile",
        dest="eager",
        action="store_false",
        default=None,
        help="torch.compile the model in vLLM (default on GPU; on CPU eager is the default)",
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-hf", action="store_true", help="skip the HF backend comparison")


def main(args: Any) -> dict[str, Any]:
    return run(
        args.model, args.episodes, args.turns, args.max_new_tokens, args.repeats, args.eager, args.dtype, not args.no_hf
    )


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run(), indent=2))
