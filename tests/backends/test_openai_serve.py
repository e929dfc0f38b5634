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
from rollforge.backends.settings import OpenAICompatSettings
from rollforge.cli.rollout import split_samples
from rollforge.endings import ending_of
from rollforge.envs.library import get_env_spec
from rollforge.errors import BackendError
from rollforge.models import load_model
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact
from rollforge.types import Message

pytest.importorskip("httpx", reason="needs the openai extra")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt(renderer):
    return renderer.prompt_ids([Message("user", "Name a colour.")]) + renderer.generation_prompt


def client(url: str, **options) -> OpenAICompatBackend:
    return OpenAICompatBackend(url, OpenAICompatSettings(model="smollm2", seed=0, request_timeout=120, **options))


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
    args = [
        "rollout",
        "--backend",
        "openai",
        "--base-url",
        vllm_server,
        "--served-model-name",
        "smollm2",
        "--model",
        str(smollm2_dir),
        "--env",
        "arithmetic",
        "--env",
        "guess_number",
        "--episodes",
        "4",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "24",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [r["task_name"] for r in records] == ["arithmetic", "guess_number"] * 2
    assert all(r["error"] is None for r in records)
    for r in records:
        trajectory = Trajectory(
            index=r["index"],
            task_name=r["task_name"],
            tools=tuple(r["tools"]),
            messages=tuple(Message(m["role"], m["content"], name=m.get("name")) for m in r["messages"]),
            token_ids=tuple(r["token_ids"]),
            loss_mask=tuple(r["loss_mask"]),
            logprobs=tuple(r["logprobs"]),
            prompt_length=r["prompt_length"],
            rewards=tuple(r["rewards"]),
            total_reward=r["total_reward"],
            turns=r["turns"],
            ending=ending_of(r),
        )
        assert token_fidelity_gap(trajectory, renderer) is None


def test_two_training_ranks_push_their_weights_to_the_server(vllm_server, smollm2_dir, hf, prompt, tmp_path):
    """Disaggregated: 2 torchrun ranks train while the server generates; after the step the server
    serves exactly the checkpoint the ranks wrote (rank 0 gathered and pushed it)."""
    import json
    import os
    import subprocess
    import sys

    from rollforge.train.logprobs import sequence_logprobs

    config = tmp_path / "train.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {
                    "name": str(smollm2_dir),
                    "backend": "openai",
                    "base_url": vllm_server,
                    "served_model_name": "smollm2",
                },
                "out": str(tmp_path / "run"),
                "steps": 1,
                "environments": [{"name": "arithmetic"}],
                "algorithm": {"batch_size": 2, "group_size": 2, "advantage": "grpo_no_std"},
                "rollout": {"max_new_tokens": 8, "max_turns": 1},
                "optim": {"lr": 1e-4, "max_grad_norm": None},
                "rewards": [{"function": "dense_reward:reply_length"}],
            }
        )
    )
    (tmp_path / "dense_reward.py").write_text(  # every group has variance, so the step moves the weights
        "def reply_length(prompts, completions, **_):\n"
        "    return [len(c[0]['content']) / 10 if c else 0.0 for c in completions]\n"
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    backend = client(vllm_server)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                "-m",
                "rollforge",
                "train",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=400,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        (metrics,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert metrics["ranks"] == 2 and metrics["policy_tokens"] > 0
        trained, _ = load_model(tmp_path / "run" / "checkpoints" / "step-000001" / "model")
        ids = prompt + [28723, 253, 1789, 30, 2]  # a fixed continuation
        n = len(ids) - len(prompt)
        with torch.inference_mode():
            ids_t = torch.tensor([ids])
            targets = torch.zeros_like(ids_t, dtype=torch.bool)
            targets[0, len(prompt) :] = True
            want = sequence_logprobs(trained, ids_t, torch.ones_like(ids_t), targets)[0, -n:]
            before = sequence_logprobs(hf[0], ids_t, torch.ones_like(ids_t), targets)[0, -n:]
        served = torch.tensor(asyncio.run(backend.score(ids))[-n:])
        assert (served - want).abs().max().item() < 1e-3
        assert (want - before).abs().max().item() > 1e-3  # the step moved the weights
    finally:
        asyncio.run(backend.update_weights(hf[0]))  # back to the original weights for the other tests
        asyncio.run(backend.close())


def test_a_fresh_run_pushes_its_weights_to_a_server_that_loaded_others(vllm_server, smollm2_dir, hf, tmp_path):
    """The trainer starts from a checkpoint the server never loaded (a warm-up's, say): before the
    first rollout it pushes its weights, so the episodes are generated by the policy it trains
    (importance ratios of the first step at 1, not those of two different models)."""
    from rollforge.recipes.launch import train
    from rollforge.train.config import load_config

    start = tmp_path / "warmed"
    model, tokenizer = load_model(smollm2_dir)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for p in model.model.layers[0].mlp.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(start)
    tokenizer.save_pretrained(start)
    config = load_config(
        overrides=[
            f"model.name={start}",
            "model.backend=openai",
            f"model.base_url={vllm_server}",
            "model.served_model_name=smollm2",
            f"out={tmp_path / 'run'}",
            "steps=1",
            "checkpoint_every=0",
            "environments=[{name: arithmetic}]",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=1",
            "optim.lr=1e-9",
            "save_trajectories=false",
            "algorithm.kl_beta=0.001",  # a KL term: every rollout is forwarded, even in a group of equal rewards
            "algorithm.off_policy_correction=none",  # ratios against the server's logprobs (auto: 1 by construction)
        ]
    )
    backend = client(vllm_server)
    try:
        (metrics,) = train(config, console=False).history
        assert metrics["policy_tokens"] > 0
        assert abs(metrics["mean_ratio"] - 1) < 2e-3, metrics["mean_ratio"]
        assert metrics["mismatch/kl"] < 1e-3, metrics["mismatch/kl"]  # unpushed weights: ~1e-2 and more
    finally:
        asyncio.run(backend.update_weights(hf[0]))  # back to the original weights for the other tests
        asyncio.run(backend.close())
