"""HFBackend on the tiny offline model: exactness against transformers, batching, stops, failures.

The reference for greedy decoding is ``model.generate(do_sample=False)`` on one prompt (no padding);
the reference for logprobs is a teacher-forced forward pass over prompt + completion. A request that
must arrive, or be cancelled, while others generate waits for a forward pass held by ``Paused``
instead of sleeping for a time.
"""

from __future__ import annotations

import asyncio
import math
import threading
import types

import pytest
import torch

from rollforge.backends.base import Backend, SamplingParams
from rollforge.backends.hf import (
    FAST_GQA_ATTENTION,
    HFBackend,
    RowSampling,
    filtered_probs,
    release_idle_openmp_threads,
    sample,
)
from rollforge.backends.settings import HFSettings
from rollforge.errors import BackendError, ConfigError
from rollforge.models import load_model
from rollforge.testing import HANG_SECONDS

NEVER = (-1,)  # a stop id no model produces: generation runs to max_new_tokens
TEXTS = (
    "The capital of France",
    "Hello",
    "What is two plus two? The answer is",
    "x",
    "The agent moved up, then right, then down, and finally reached",
    "for i in range(10): print(i * i)\nGood",
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def model(tiny):
    return tiny[0]


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return tiny[1]


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(text) for text in TEXTS]


@pytest.fixture
async def backend(model, tokenizer):
    backend = HFBackend(model, tokenizer, HFSettings(max_wait_ms=20))
    yield backend
    await backend.close()


class Paused:
    """The model's forward passes, counted from 1, stop at the passes ``at`` until the test lets them
    go on: ``await paused.reached(k)`` returns once pass ``k`` waits, ``paused.go(k)`` runs it."""

    def __init__(self, monkeypatch, model, at):
        original, self.passes = type(model).forward, 0
        self._waiting = {k: threading.Event() for k in at}
        self._go = {k: threading.Event() for k in at}

        def forward(module, *args, **kwargs):
            self.passes += 1
            if self.passes in self._go:
                self._waiting[self.passes].set()
                self._go[self.passes].wait(HANG_SECONDS)
            return original(module, *args, **kwargs)

        monkeypatch.setattr(type(model), "forward", forward)

    async def reached(self, k: int) -> None:
        assert await asyncio.to_thread(self._waiting[k].wait, HANG_SECONDS), f"forward pass {k} never came"

    def go(self, k: int) -> None:
        self._go[k].set()


async def settle() -> None:
    """Let every ready task run until it waits (a number of loop passes, not a time)."""
    for _ in range(20):
        await asyncio.sleep(0)


def unstopped(max_new_tokens, temperature=0.0):
    """Params that run to max_new_tokens."""
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, stop_token_ids=NEVER)


def greedy_reference(model, prompt, max_new_tokens, stop_id):
    """Token ids ``model.generate`` produces for one unpadded prompt, up to and including stop_id."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop_id,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def teacher_forced_logprobs(model, prompt, completion):
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].float()  # (T, V)
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (n, V)
    return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_backend_satisfies_protocol(backend):
    assert isinstance(backend, Backend)


# --- greedy exactness and batching ----------------------------------------------------------------


async def test_greedy_alone_equals_model_generate(backend, model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=24, temperature=0)
    for prompt in prompts[:3]:
        completion = await backend.generate(prompt, params)
        assert list(completion.token_ids) == greedy_reference(model, prompt, 24, tokenizer.eos_token_id)


async def test_greedy_with_staggered_arrivals_equals_model_generate(backend, model, tokenizer, prompts, monkeypatch):
    params = SamplingParams(max_new_tokens=40, temperature=0)
    paused = Paused(monkeypatch, model, at=[2 * i for i in range(1, len(prompts))])
    requests = [asyncio.create_task(backend.generate(prompts[0], params))]
    for i, prompt in enumerate(prompts[1:], 1):  # each arrives while the batch is generating
        await paused.reached(2 * i)
        requests.append(asyncio.create_task(backend.generate(prompt, params)))
        await settle()
        paused.go(2 * i)
    completions = await asyncio.wait_for(asyncio.gather(*requests), HANG_SECONDS)

    for prompt, completion in zip(prompts, completions):
        expected = greedy_reference(model, prompt, 40, tokenizer.eos_token_id)
        assert list(completion.token_ids) == expected
        assert completion.finish_reason == ("stop" if expected[-1] == tokenizer.eos_token_id else "length")
    stats = backend.stats
    assert stats.joins >= 1, "later arrivals must join the running batch"
    assert stats.max_running >= 2
    assert stats.completed == len(prompts)


async def test_simultaneous_requests_share_every_forward_pass(model, tokenizer, prompts):
    backend = HFBackend(model, tokenizer, HFSettings(max_wait_ms=50))
    params = unstopped(12)
    try:
        completions = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
    finally:
        await backend.close()
    assert all(len(c.token_ids) == 12 and c.finish_reason == "length" for c in completions)
    stats = backend.stats
    # One prefill for all six prompts (it samples token 1), then 11 decode steps of all six rows.
    assert (stats.prefill_passes, stats.prefill_rows) == (1, 6)
    assert (stats.decode_steps, stats.decode_rows) == (11, 66)
    assert stats.forward_passes == 12
    assert stats.mean_decode_batch == 6
    assert stats.generated_tokens == 72


async def test_max_batch_size_caps_the_running_batch(model, tokenizer, prompts):
    backend = HFBackend(model, tokenizer, HFSettings(max_batch_size=2))
    params = SamplingParams(max_new_tokens=10, temperature=0)
    try:
        completions = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
    finally:
        await backend.close()
    assert backend.stats.max_running == 2
    for prompt, completion in zip(prompts, completions):
        assert list(completion.token_ids) == greedy_reference(model, prompt, 10, tokenizer.eos_token_id)


async def test_max_prefill_tokens_splits_a_large_admission(model, tokenizer, prompts):
    backend = HFBackend(model, tokenizer, HFSettings(max_wait_ms=50, max_prefill_tokens=12))
    params = SamplingParams(max_new_tokens=8, temperature=0)
    long_prompt = prompts[4]  # 12 tokens or more: it is prefilled alone
    assert len(long_prompt) >= 12
    try:
        jobs = [backend.generate(p, params) for p in [long_prompt, *prompts[:3]]]
        completions = await asyncio.gather(*jobs)
    finally:
        await backend.close()
    assert backend.stats.prefill_passes >= 2
    for prompt, completion in zip([long_prompt, *prompts[:3]], completions):
        assert list(completion.token_ids) == greedy_reference(model, prompt, 8, tokenizer.eos_token_id)


async def test_fast_gqa_attention_is_exact_and_restored_on_close(model, tokenizer, prompts):
    params = unstopped(20)
    results = {}
    for fast in (True, False):
        backend = HFBackend(model, tokenizer, HFSettings(fast_gqa=fast))
        expected = FAST_GQA_ATTENTION if fast else "sdpa"
        assert model.config._attn_implementation == expected
        try:
            results[fast] = await asyncio.gather(*(backend.generate(p, params) for p in prompts))
        finally:
            await backend.close()
        assert model.config._attn_implementation == "sdpa"
    for fast, slow in zip(results[True], results[False]):
        assert fast.token_ids == slow.token_ids
        assert fast.logprobs == pytest.approx(slow.logprobs, abs=1e-5)


def test_releasing_idle_openmp_threads_keeps_results(model, prompts):
    ids = torch.tensor([prompts[0]])
    with torch.inference_mode():
        before = model(ids).logits
        released = release_idle_openmp_threads()  # this thread's pool is idle now
        after = model(ids).logits  # libgomp recreates the pool on demand
    assert released == any("libgomp" in line for line in open("/proc/self/maps"))
    assert torch.equal(before, after)


async def test_identical_prompts_share_one_prefill_row(model, tokenizer, prompts):
    """A GRPO group: four requests with one prompt (different seeds) and one other prompt. The pass
    computes two prompts; every row still samples with its own seed and scores its own tokens."""
    group = [SamplingParams(max_new_tokens=10, temperature=1.0, seed=s, stop_token_ids=NEVER) for s in range(4)]
    backend = HFBackend(model, tokenizer, HFSettings(max_wait_ms=50))
    try:
        together = await asyncio.gather(
            *(backend.generate(prompts[2], p) for p in group), backend.generate(prompts[0], unstopped(10))
        )
        stats = backend.stats
        alone = [await backend.generate(prompts[2], p) for p in group]
    finally:
        await backend.close()
    assert (stats.prefill_passes, stats.prefill_rows, stats.prefill_shared) == (1, 5, 3)
    assert [c.token_ids for c in together[:4]] == [c.token_ids for c in alone]
    assert len({c.token_ids for c in together[:4]}) > 1  # the copies did not share a sampler
    assert list(together[4].token_ids) == greedy_reference(model, prompts[0], 10, -1)
    for completion in together[:4]:
        expected = teacher_forced_logprobs(model, prompts[2], completion.token_ids)
        assert (torch.tensor(completion.logprobs) - expected).abs().max().item() < 1e-4


# --- logprobs and sampling ------------------------------------------------------------------------


async def test_logprobs_equal_a_teacher_forced_forward_pass(backend, model, prompts):
    requests = [
        unstopped(20),
        SamplingParams(max_new_tokens=20, temperature=1.3, top_p=0.9, seed=1, stop_token_ids=NEVER),
        SamplingParams(max_new_tokens=20, temperature=0.7, top_k=20, seed=2, stop_token_ids=NEVER),
    ]
    # Different prompt lengths in one batch: padding must not leak into the logprobs.
    jobs = [backend.generate(prompts[i], params) for i, params in enumerate(requests)]
    completions = await asyncio.gather(*jobs)
    for prompt, completion in zip(prompts, completions):
        expected = teacher_forced_logprobs(model, prompt, completion.token_ids)
        diff = (torch.tensor(completion.logprobs) - expected).abs().mean().item()
        assert diff < 1e-4


async def test_seeded_sampling_does_not_depend_on_batch_company(backend, prompts):
    params = SamplingParams(max_new_tokens=30, temperature=1.0, seed=123, stop_token_ids=NEVER)
    alone = await backend.generate(prompts[0], params)
    others = [SamplingParams(max_new_tokens=25, temperature=0.8, seed=i, stop_token_ids=NEVER) for i in range(5)]
    in_company, *_ = await asyncio.gather(
        backend.generate(prompts[0], params), *(backend.generate(p, o) for p, o in zip(prompts[1:], others))
    )
    assert in_company.token_ids == alone.token_ids
    different_seed = await backend.generate(prompts[0], SamplingParams(**{**params.__dict__, "seed": 124}))
    assert different_seed.token_ids != alone.token_ids


async def test_unseeded_requests_draw_from_the_backend_seed(model, tokenizer, prompts):
    params = SamplingParams(max_new_tokens=20, temperature=1.0, stop_token_ids=NEVER)
    runs = []
    for _ in range(2):
        backend = HFBackend(model, tokenizer, HFSettings(seed=7))
        try:
            runs.append([(await backend.generate(prompts[0], params)).token_ids for _ in range(2)])
        finally:
            await backend.close()
    assert runs[0] == runs[1]  # same backend seed: same sequence of samples
    assert runs[0][0] != runs[0][1]  # but two requests do not share a generator


async def test_top_k_1_and_tiny_top_p_are_greedy(backend, prompts):
    greedy = await backend.generate(prompts[2], SamplingParams(max_new_tokens=15, temperature=0))
    top_k = await backend.generate(prompts[2], SamplingParams(max_new_tokens=15, temperature=2.0, top_k=1))
    top_p = await backend.generate(prompts[2], SamplingParams(max_new_tokens=15, temperature=2.0, top_p=1e-6))
    assert top_k.token_ids == greedy.token_ids == top_p.token_ids
    assert top_k.logprobs == pytest.approx(greedy.logprobs, abs=1e-5)


def test_sample_draws_by_inverse_cdf_over_the_filtered_distribution():
    # Row probabilities (1/8, 3/8, 4/8): the CDF is (0.125, 0.5, 1.0).
    logits = torch.log(torch.tensor([[1.0, 3.0, 4.0]] * 4))
    params = [
        SamplingParams(temperature=1.0),  # u = 0.10 < 0.125 -> token 0
        SamplingParams(temperature=1.0),  # u = 0.30 in [0.125, 0.5) -> token 1
        SamplingParams(temperature=1.0, top_k=2),  # tokens 1, 2 renormalized: CDF (0, 3/7, 1); u = 0.4 -> 1
        SamplingParams(temperature=1.0, top_p=0.5),  # top-p 0.5 keeps only token 2 (mass 4/8)
    ]
    # The draw walks token ids in order for every row, whatever filters its neighbours use.
    uniforms = torch.tensor([0.10, 0.30, 0.40, 0.01])
    tokens, logprobs = sample(logits, uniforms, RowSampling.from_params(params))
    assert tokens.tolist() == [0, 1, 1, 2]
    # Logprobs are those of the raw distribution, whatever the filters.
    expected = [math.log(1 / 8), math.log(3 / 8), math.log(3 / 8), math.log(4 / 8)]
    assert logprobs.tolist() == pytest.approx(expected, abs=1e-6)


def reference_support(scaled_row, top_k, top_p):
    """Token ids top-k then top-p keep, the textbook way: full sort, renormalise, nucleus."""
    order = scaled_row.argsort(descending=True)
    if top_k:
        order = order[:top_k]
    probs = torch.softmax(scaled_row[order].double(), dim=-1)
    before = probs.cumsum(0) - probs
    if top_p < 1:
        order = order[before < top_p]
    return set(order.tolist())


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])  # flat to peaked: the top-p window grows or not
def test_filters_keep_the_same_tokens_as_a_full_sort(scale):
    generator = torch.Generator().manual_seed(0)
    vocab = 5000
    scaled = torch.randn(6, vocab, generator=generator) * scale
    params = [
        SamplingParams(top_k=0, top_p=1.0),
        SamplingParams(top_k=40),
        SamplingParams(top_p=0.9),
        SamplingParams(top_k=300, top_p=0.8),
        SamplingParams(top_k=3, top_p=0.99),
        SamplingParams(top_p=0.3),
    ]
    probs = filtered_probs(scaled, RowSampling.from_params(params))
    for row, p in enumerate(params):
        kept = set(probs[row].nonzero().squeeze(1).tolist())
        assert kept == reference_support(scaled[row], p.top_k, p.top_p)


def test_sample_greedy_rows_take_the_argmax_and_temperature_rescales():
    logits = torch.tensor([[0.0, 1.0, 0.5], [0.0, 1.0, 0.5]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1e-3)]
    tokens, _ = sample(logits, torch.tensor([0.0, 0.999]), RowSampling.from_params(params))
    # A near-zero temperature puts (almost) all mass on the argmax, whatever the uniform.
    assert tokens.tolist() == [1, 1]


# --- stop conditions ------------------------------------------------------------------------------


async def test_stop_token_id_ends_the_completion_and_is_kept(backend, prompts):
    free = await backend.generate(prompts[0], unstopped(30))
    ids = list(free.token_ids)
    position = next(i for i in range(5, len(ids)) if ids[i] not in ids[:i])  # first occurrence
    params = SamplingParams(max_new_tokens=30, temperature=0, stop_token_ids=(ids[position],))
    stopped = await backend.generate(prompts[0], params)
    assert list(stopped.token_ids) == ids[: position + 1]
    assert stopped.finish_reason == "stop"


async def test_eos_of_the_tokenizer_is_the_default_stop(model, tokenizer, prompts):
    probe = HFBackend(model, tokenizer)
    try:
        free = await probe.generate(prompts[0], unstopped(30))
    finally:
        await probe.close()
    ids = list(free.token_ids)
    position = next(i for i in range(5, len(ids)) if ids[i] not in ids[:i])
    # A tokenizer whose eos is that token: no stop ids given -> it stops there.
    stand_in = types.SimpleNamespace(eos_token_id=ids[position], pad_token_id=0, decode=tokenizer.decode)
    backend = HFBackend(model, stand_in)
    try:
        stopped = await backend.generate(prompts[0], SamplingParams(max_new_tokens=30, temperature=0))
    finally:
        await backend.close()
    assert list(stopped.token_ids) == ids[: position + 1]
    assert stopped.finish_reason == "stop"


async def test_stop_string_ends_at_the_token_that_completes_it(backend, tokenizer, prompts):
    free = await backend.generate(prompts[2], unstopped(40))
    ids = list(free.token_ids)
    # An ASCII stop string taken from the text of a token in the middle, not seen before it.
    position, stop = next(
        (i, text)
        for i in range(6, len(ids))
        if len(text := tokenizer.decode([ids[i]]).strip()) >= 2
        and text.isascii()
        and text.isprintable()
        and text not in tokenizer.decode(ids[:i])
    )
    params = SamplingParams(max_new_tokens=40, temperature=0, stop=(stop,), stop_token_ids=NEVER)
    stopped = await backend.generate(prompts[2], params)
    assert list(stopped.token_ids) == ids[: position + 1]
    assert stopped.finish_reason == "stop"
    assert tokenizer.decode(stopped.token_ids).endswith(stop)


async def test_max_new_tokens_ends_with_length(backend, prompts):
    completion = await backend.generate(prompts[1], unstopped(3, temperature=0.9))
    assert len(completion.token_ids) == len(completion.logprobs) == 3
    assert completion.finish_reason == "length"


async def test_budget_is_capped_by_the_model_positions(backend, model):
    limit = model.config.max_position_embeddings
    prompt = [5] * (limit - 4)
    completion = await backend.generate(prompt, unstopped(50))
    assert len(completion.token_ids) == 4
    assert completion.finish_reason == "length"


# --- failures -------------------------------------------------------------------------------------


async def test_overlong_prompt_fails_alone(backend, model, tokenizer, prompts):
    limit = model.config.max_position_embeddings
    params = SamplingParams(max_new_tokens=20, temperature=0)
    results = await asyncio.gather(
        backend.generate([5] * (limit + 10), params),
        *(backend.generate(p, params) for p in prompts[:3]),
        return_exceptions=True,
    )
    assert isinstance(results[0], BackendError)
    assert f"{limit + 10} tokens" in str(results[0]) and str(limit) in str(results[0])
    for prompt, completion in zip(prompts, results[1:]):
        assert list(completion.token_ids) == greedy_reference(model, prompt, 20, tokenizer.eos_token_id)
    assert backend.stats.failed == 1


@pytest.mark.parametrize(
    ("prompt", "message"),
    [([], "empty"), ([1, 2, 10_000], "token id 10000"), ([-3, 4], "token id -3")],
)
async def test_invalid_prompts_fail_with_a_clear_error(backend, prompts, prompt, message):
    with pytest.raises(BackendError, match=message):
        await backend.generate(prompt, SamplingParams(max_new_tokens=4))
    assert (await backend.generate(prompts[0], SamplingParams(max_new_tokens=4))).token_ids


async def test_failing_prefill_fails_only_its_requests(backend, model, tokenizer, prompts, monkeypatch):
    marker = 17
    original = type(model).forward

    def forward(self, input_ids=None, **kwargs):
        if input_ids.shape[1] > 1 and bool((input_ids == marker).any()):
            raise RuntimeError("boom in prefill")
        return original(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(type(model), "forward", forward)
    paused = Paused(monkeypatch, model, at=[2])
    params = SamplingParams(max_new_tokens=30, temperature=0)
    good = asyncio.create_task(backend.generate(prompts[0], params))
    await paused.reached(2)  # the good request is decoding: the bad one arrives late
    bad = asyncio.create_task(backend.generate([marker, marker, 3], params))
    await settle()
    paused.go(2)
    good, bad = await asyncio.wait_for(asyncio.gather(good, bad, return_exceptions=True), HANG_SECONDS)
    assert isinstance(bad, BackendError) and "boom in prefill" in str(bad)
    assert list(good.token_ids) == greedy_reference(model, prompts[0], 30, tokenizer.eos_token_id)


async def test_worker_crash_fails_pending_and_later_requests(model, tokenizer, prompts, monkeypatch):
    original = type(model).forward
    calls = {"n": 0}

    def forward(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the prefill and one decode step succeed, the second decode step fails
            raise RuntimeError("boom in decode")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", forward)
    backend = HFBackend(model, tokenizer, HFSettings(max_wait_ms=50))
    params = unstopped(20)
    try:
        results = await asyncio.wait_for(
            asyncio.gather(*(backend.generate(p, params) for p in prompts[:4]), return_exceptions=True), 30
        )
        assert all(isinstance(r, BackendError) and "boom in decode" in str(r) for r in results)
        with pytest.raises(BackendError, match="crashed"):
            await backend.generate(prompts[0], params)
    finally:
        await backend.close()


async def test_cancelled_request_leaves_the_batch(backend, model, tokenizer, prompts, monkeypatch):
    paused = Paused(monkeypatch, model, at=[3])
    greedy_30 = SamplingParams(max_new_tokens=30, temperature=0)
    doomed = asyncio.create_task(backend.generate(prompts[0], unstopped(200)))
    survivor = asyncio.create_task(backend.generate(prompts[1], greedy_30))
    await paused.reached(3)  # both are generating
    doomed.cancel()
    await settle()
    paused.go(3)
    completion = await asyncio.wait_for(survivor, HANG_SECONDS)
    assert list(completion.token_ids) == greedy_reference(model, prompts[1], 30, tokenizer.eos_token_id)
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert backend.stats.completed == 1


async def test_close_fails_pending_requests_and_refuses_new_ones(model, tokenizer, prompts, monkeypatch):
    paused = Paused(monkeypatch, model, at=[2])
    backend = HFBackend(model, tokenizer)
    params = unstopped(200)
    pending = asyncio.create_task(backend.generate(prompts[0], params))
    await paused.reached(2)  # generating
    closing = asyncio.create_task(backend.close())
    await settle()
    paused.go(2)
    await asyncio.wait_for(closing, HANG_SECONDS)
    with pytest.raises(BackendError, match="closed"):
        await asyncio.wait_for(pending, HANG_SECONDS)
    with pytest.raises(BackendError, match="closed"):
        await backend.generate(prompts[0], SamplingParams(max_new_tokens=2))
    await backend.close()  # idempotent


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_batch_size", 0), ("max_wait_ms", -1.0), ("max_prefill_tokens", 0), ("num_threads", 0)],
)
def test_bad_options_are_config_errors(model, tokenizer, option, value):
    with pytest.raises(ConfigError, match=option):
        HFBackend(model, tokenizer, HFSettings(**{option: value}))


def test_sliding_window_models_are_rejected(tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=16,
    )
    with pytest.raises(ConfigError, match="DynamicSlidingWindowLayer"):
        HFBackend(MistralForCausalLM(config), tokenizer)


# --- the real model -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_smollm2_answers_a_chat_prompt(smollm2_dir):
    model, tokenizer = load_model(smollm2_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    backend = HFBackend(model, tokenizer)
    try:
        completion = await backend.generate(prompt, SamplingParams(max_new_tokens=48, temperature=0))
    finally:
        await backend.close()
    text = tokenizer.decode(completion.token_ids)
    assert completion.finish_reason == "stop"
    assert text.endswith("<|im_end|>") and text.removesuffix("<|im_end|>").strip()
    assert "Paris" in text


# --- precision -------------------------------------------------------------------------------------


async def test_compute_dtype_runs_generation_under_autocast_like_the_trainer(tiny_model_dir, prompts):
    model, tokenizer = load_model(tiny_model_dir)  # float32 weights: the trainer's master copy
    seen = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    backend = HFBackend(model, tokenizer, HFSettings(compute_dtype=torch.bfloat16))
    try:
        completion = await backend.generate(prompts[0], unstopped(6))
    finally:
        await backend.close()
    assert seen and set(seen) == {torch.bfloat16}  # one prefill and five decode steps, all in bfloat16
    assert len(seen) == 6 and {p.dtype for p in model.parameters()} == {torch.float32}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = teacher_forced_logprobs(model, prompts[0], completion.token_ids)
    # bfloat16 keeps ~3 significant digits; batch shapes differ between the two passes
    assert torch.allclose(torch.tensor(completion.logprobs), mixed, atol=0.1)
