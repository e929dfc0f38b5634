"""Killing an OpenEnv server mid-run fails only the episodes it was serving; the run completes and
new episodes reconnect to the restarted server."""

from __future__ import annotations

import pytest

from rollforge.envs.openenv import OpenEnvEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample

pytestmark = pytest.mark.slow

ADD_ONE = '<tool_call>\n{"name": "add", "arguments": {"n": 1}}\n</tool_call>'


@pytest.fixture
def server(start_servers):
    return start_servers({"counter": ("counter", 4)})


async def test_server_killed_mid_run_fails_only_the_running_episodes(server, renderer, scripted):
    def script(request) -> str:
        if request.call == 6:  # turn 2 of the first four episodes: kill, and restart in the background
            server.kill()
            server.start(wait=False)
        return ADD_ONE

    env = OpenEnvEnvironment(server.url["counter"], connect_timeout=90)
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}], task_name="c", row={"seed": 3 * i}) for i in range(8)]
    result = await arollout(samples, {"c": env}, scripted(script), renderer, RolloutConfig(concurrency=4, max_turns=8))
    first, second = result.trajectories[:4], result.trajectories[4:]
    for t in first:  # were running when the server died: failed with the reason, tokens kept
        assert t.error is not None and t.error.kind == "env_error", t
        assert "connection to the OpenEnv server" in t.error.message and "lost" in t.error.message
        # generated tokens are kept; how many turns finished before the kill depends on timing
        assert len(t.token_ids) > t.prompt_length and t.turns < 5
    for t in second:  # started after the crash: reconnected to the restarted server
        assert t.error is None and t.terminated and t.total_reward == 1.0 and t.turns == 5
    assert result.metrics["errors"] == {"env_error": 4}
