"""OpenAICompatBackend against a real ``vllm serve`` of SmolLM2-135M on 127.0.0.1 (CPU, float32):
token-exact multi-turn rollouts, raw logprobs, weight sync through the server's dev endpoints, and
detection of a server whose weights changed behind the trainer's back.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rollforge.backends.base import SamplingParams
from rollforge.backends.openai_compat import OpenAICompatBackend
from rollforge.cli.rollout import split_samples
from rollforge.envs.library import get_env_spec
from rollforge.errors import BackendError
from rollforge.models import load_model
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Message

from rollout_checks import RecordingBackend, assert_token_exact

pytest.importorskip("httpx", reason="needs the openai extra")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt(renderer):
    return renderer.prompt_ids([Message("user", "Name a colour.")]) + renderer.generation_prompt


def client(url: str, **options) -> OpenAICompatBackend:
    return OpenAICompatBackend(url, model="smollm2", seed=0, request_timeout=120, **options)


def teacher_forced(model, ids: list[int], start: int) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0].float()  # (T, V)
    logprobs = torch.log_softmax(logits[start - 1 : -1], dim=-1)  # (n, V)
    return logprobs.gather(1, torch.tensor(ids[start:])[:, None]).squeeze(1)


def test_multi_turn_rollouts_are_token_exact(vllm_server, renderer):
    specs = [get_env_spec("arithmetic"), get_env_spec("guess_number"), get_env_spec("catch")]
    samples = split_samples(specs, 9, seed=2)
    recording = RecordingBackend(client(vllm_server))
    config = RolloutConfig(max_turns=3, max_new_tokens=32, concurrency=9, seed=2)
    result = asyncio.run(arollout(samples, {s.name: s.build() for s in specs}, recording, renderer, config))
    asyncio.run(recording.inner.close())
    matched = assert_token_exact(result.trajectories, recording.calls, renderer)
    assert matched > len(samples), "some episodes must take several turns"


def test_logprobs_are_those_of_the_raw_model_distribution(vllm_server, hf, prompt):
    backend = client(vllm_server)
    params = SamplingParams(max_new_tokens=24, temperature=1.5, top_p=0.9, seed=11, stop_token_ids=(-1,))
    completion = asyncio.run(backend.generate(prompt, params))
    assert len(completion.token_ids) == 24 and completion.finish_reason == "length"
    reference = teacher_forced(hf[0], prompt + list(completion.token_ids), len(prompt))
    assert (reference - torch.tensor(completion.logprobs)).abs().max().item() < 1e-3


def test_weight_sync_through_the_server_and_stale_policy_detection(vllm_server, smollm2_dir, hf, prompt):
    import httpx

    model, _ = load_model(smollm2_dir)
    backend = client(vllm_server, version_check_interval=0.01)
    sequence = asyncio.run(backend.generate(prompt, SamplingParams(max_new_tokens=12, seed=3, stop_token_ids=(-1,))))
    ids = prompt + list(sequence.token_ids)
    before = teacher_forced(model, ids, len(prompt))

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # one policy-gradient step, advantage +1
    logits = model(torch.tensor([ids])).logits[0, len(prompt) - 1 : -1].float()  # (n, V)
    loss = -torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[len(prompt) :])[:, None]).mean()
    loss.backward()
    optimizer.step()
    after = teacher_forced(model, ids, len(prompt))

    try:
        asyncio.run(backend.update_weights(model))
        served = torch.tensor(asyncio.run(backend.score(ids))[len(prompt) :])
        assert (served - after).abs().max().item() < 1e-3
        assert (served - before).abs().mean().item() > 0.05

        # Someone else changes the server's weights: the trainer's requests now fail loudly.
        httpx.post(f"{vllm_server}/update_weight_version", json={"new_version": "someone-else"}, timeout=10)
        with pytest.raises(BackendError, match=r"stale policy: .*'someone-else'"):
            asyncio.run(backend.generate(prompt, SamplingParams(max_new_tokens=4)))
    finally:
        asyncio.run(backend.update_weights(hf[0]))  # back to the original weights
        restored = torch.tensor(asyncio.run(backend.score(ids))[len(prompt) :])
        asyncio.run(backend.close())
    assert (restored - before).abs().max().item() < 1e-3


def test_rollout_cli_with_the_openai_backend(vllm_server, smollm2_dir, renderer, tmp_path):
    import json

    from rollforge.chat.render import token_fidelity_gap
    from rollforge.cli.main import main
    from rollforge.types import Trajectory

    out = tmp_path / "run"
    args = ["rollout", "--backend", "openai", "--base-url", vllm_server, "--served-model-name", "smollm2",
            "--model", str(smollm2_dir), "--env", "arithmetic", "--env", "guess_number", "--episodes", "4",
            "--max-turns", "2", "--max-new-tokens", "24", "--out", str(out)]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["task_name"] for r in records] == ["arithmetic", "guess_number"] * 2
    assert all(r["error"] is None for r in records)
    for r in records:
        trajectory = Trajectory(
            index=r["index"], task_name=r["task_name"], tools=tuple(r["tools"]),
            messages=tuple(Message(m["role"], m["content"], name=m.get("name")) for m in r["messages"]),
            token_ids=tuple(r["token_ids"]), loss_mask=tuple(r["loss_mask"]), logprobs=tuple(r["logprobs"]),
            prompt_length=r["prompt_length"], rewards=tuple(r["rewards"]), total_reward=r["total_reward"],
            turns=r["turns"], terminated=r["terminated"], truncated=r["truncated"],
            max_turns_reached=r["max_turns_reached"],
        )
        assert token_fidelity_gap(trajectory, renderer) is None
