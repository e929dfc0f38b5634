"""The synchronous loop on the tiny model with a backend that always fails one episode: the episode
is retried ``algorithm.infra_retries`` times, then left out of its group's baseline, and the step's
metrics say so."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from rollforge.backends.base import CURRENT_EPISODE
from rollforge.backends.hf import HFBackend
from rollforge.errors import BackendError
from rollforge.recipes.launch import train

FAILED = 5  # episode index in each step's batch: member 5 of group 0 (group_size 8)


@pytest.fixture
def dead_for_one_episode(monkeypatch):
    """The HF backend fails every request of episode ``FAILED`` (as an inference server that keeps
    dropping one request would); returns the list of failed requests."""
    failed: list[int] = []
    generate = HFBackend.generate

    async def flaky(self, prompt_ids, params):
        episode = CURRENT_EPISODE.get()  # the engine's state of the running episode
        if episode is not None and episode.index == FAILED:
            failed.append(episode.index)
            raise BackendError("injected: the inference server dropped the request")
        return await generate(self, prompt_ids, params)

    monkeypatch.setattr(HFBackend, "generate", flaky)
    return failed


def test_an_episode_whose_backend_keeps_failing_is_retried_then_left_out_of_its_group(
    tiny_config, dead_for_one_episode
):
    config = tiny_config("steps=2", "algorithm.infra_retries=2", "algorithm.advantage=grpo")
    result = train(config, console=False)
    assert len(dead_for_one_episode) == 2 * 3  # per step: the first run and two reruns, one request each
    for metrics in result.history:
        assert metrics["infra/failed_episodes"] == 1 and metrics["infra/retries"] == 2
        assert (metrics["infra/groups_shrunk"], metrics["infra/groups_lost"]) == (1, 0)
        assert metrics["infra/reward_lost"] == 1 / 32 and metrics["episodes/policy_failures"] == 0
        assert (metrics["rollout/infra_retries"], metrics["rollout/infra_failures"]) == (2, 1)
        assert metrics["rollout/errors/backend_error"] == 1

    signals = 0
    for step, metrics in zip((1, 2), result.history):
        records = [json.loads(line) for line in (result.out / "trajectories" / f"step-{step:06d}.jsonl").open()]
        assert len(records) == 32
        failed = records[FAILED]
        assert (failed["error"]["kind"], failed["retries"], failed["advantage"]) == ("backend_error", 2, 0.0)
        assert [r["retries"] for i, r in enumerate(records) if i != FAILED] == [0] * 31
        # group 0 by hand over its 7 kept members: (r - mean) / (population std + 1e-6), 0 when flat
        kept = [r["reward"] for i, r in enumerate(records[:8]) if i != FAILED]
        mean, std = statistics.fmean(kept), statistics.pstdev(kept)
        expected = [0.0 if std == 0 else (r - mean) / (std + 1e-6) for r in kept]
        got = [r["advantage"] for i, r in enumerate(records[:8]) if i != FAILED]
        assert got == pytest.approx(expected, abs=1e-5)
        signals += std > 0
        # the unknown reward is not in the step's reward statistics
        known = [r["reward"] for i, r in enumerate(records) if i != FAILED]
        assert metrics["reward/mean"] == pytest.approx(statistics.fmean(known), abs=1e-12)
        assert metrics["reward/std"] == pytest.approx(statistics.pstdev(known), abs=1e-12)
        assert math.isfinite(metrics["loss"])
    assert signals >= 1, "group 0 was flat in both steps: the hand-checked advantages checked nothing"
