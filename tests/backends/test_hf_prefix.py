"""The HF backend reuses a finished request's cache for the request that continues it (the next
turn of an episode): same tokens, same logprobs, fewer tokens prefilled."""

import pytest

from rollforge import ChatRenderer, HFBackend, HFSettings, RolloutConfig, arollout
from rollforge.backends.base import SamplingParams
from rollforge.backends.hf_prefix import CachedPrefix, PrefixStore
from rollforge.envs.library import get_env_spec
from rollforge.models import load_model


async def _rollout(model, tokenizer, prefix_cache_mb):
    spec = get_env_spec("guess_number")
    samples = [s for s in spec.samples(3, 0) for _ in range(2)]
    backend = HFBackend(model, tokenizer, HFSettings(prefix_cache_mb=prefix_cache_mb))
    try:
        result = await arollout(
            samples,
            {"guess_number": spec.build()},
            backend,
            ChatRenderer(tokenizer),
            RolloutConfig(max_turns=4, max_new_tokens=8, greedy=True),
        )
        return result.trajectories, backend.stats
    finally:
        await backend.close()


async def test_multi_turn_rollouts_are_identical_with_and_without_reuse(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    plain, plain_stats = await _rollout(model, tokenizer, 0)
    reused, stats = await _rollout(model, tokenizer, 64)
    assert sum(t.turns for t in reused) > len(reused)  # multi-turn: later turns can reuse
    assert plain_stats.prefix_hits == 0
    assert stats.prefix_hits == sum(t.turns - 1 for t in reused)  # every later turn continued its cache
    assert stats.prefix_tokens_reused > 0
    for a, b in zip(plain, reused):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


async def test_invalidated_caches_are_not_reused(tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    backend = HFBackend(model, tokenizer, HFSettings(prefix_cache_mb=64))
    try:
        prompt = tuple(tokenizer.encode("The quick brown fox"))
        first = await backend.generate(prompt, SamplingParams(max_new_tokens=4, temperature=0))
        follow_up = prompt + first.token_ids + tuple(tokenizer.encode(" jumps"))
        backend.invalidate_cache()  # e.g. an optimizer step changed the weights in place
        await backend.generate(follow_up, SamplingParams(max_new_tokens=2, temperature=0))
        assert backend.stats.prefix_hits == 0
        second = await backend.generate(prompt, SamplingParams(max_new_tokens=4, temperature=0))
        await backend.generate(prompt + second.token_ids + (5,), SamplingParams(max_new_tokens=2, temperature=0))
        assert backend.stats.prefix_hits == 1
    finally:
        await backend.close()


def test_store_takes_the_longest_proper_prefix_and_evicts_by_size():
    import torch

    def entry(ids):
        kv = torch.zeros(1, len(ids), 2)
        return CachedPrefix(tuple(ids), ((kv, kv),))  # 16 bytes per token

    store = PrefixStore(max_bytes=16 * 10)
    store.put(entry([1, 2, 3, 4]))
    assert store.take((1, 2, 3, 4)) is None  # not a proper prefix: no new token to compute
    store.put(entry([1, 2]))
    store.put(entry([1, 2]))  # an identical episode: kept side by side
    assert store.take((1, 2, 3, 4, 5)).ids == (1, 2, 3, 4)  # longest match, and taken
    assert store.take((1, 2, 3, 4, 5)).ids == (1, 2)
    assert store.take((1, 2, 9)).ids == (1, 2)
    assert store.take((1, 2, 9)) is None and len(store) == 0
    store.put(entry(range(6)))
    store.put(entry(range(10, 16)))  # 12 tokens > 10: the oldest goes
    assert len(store) == 1 and store.take(tuple(range(10, 17))) is not None
