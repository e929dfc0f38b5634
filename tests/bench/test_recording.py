"""The benchmarks' recording wrapper: a ``Backend`` the engine accepts, keeping each request with
its episode (the vLLM bench replays them turn by turn, the gateway bench session by session)."""

from __future__ import annotations

import asyncio

from rollforge.backends.base import Backend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.bench.recording import RecordingBackend
from rollforge.bench.vllm_throughput import _Conversation, _samples
from rollforge.chat.render import ChatRenderer
from rollforge.models import load_tokenizer
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout


def test_recorded_rollout_keeps_every_request_with_its_episode(tiny_model_dir):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    scripted = ScriptedBackend(lambda request: f"reply {request.call}", renderer.tokenizer,
                               end_token_id=renderer.stop_token_ids[0])
    recorder = RecordingBackend(scripted)
    assert isinstance(recorder, Backend) and not recorder.syncs_weights
    assert recorder.shares_model(object()) is False and recorder.supports_sleep is False
    config = RolloutConfig(max_turns=2, max_new_tokens=8, greedy=True, concurrency=3)
    result = asyncio.run(arollout(_samples(3, 0), {"default": _Conversation()}, recorder, renderer, config))

    assert [t.error for t in result.trajectories] == [None] * 3
    episodes = recorder.per_episode()
    assert [len(requests) for requests in episodes] == [2, 2, 2]  # two turns each
    for first, second in episodes:
        assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids  # the same conversation, grown
        assert second.prompt_ids[len(first.prompt_ids):][: len(first.completion.token_ids)] == first.completion.token_ids
    calls = sorted(int(renderer.tokenizer.decode(r.completion.token_ids[:-1]).split()[-1])
                   for requests in episodes for r in requests)
    assert calls == list(range(6))  # every request the backend served was recorded once
    asyncio.run(recorder.close())
    assert not scripted._closed  # whoever opened the wrapped backend closes it
