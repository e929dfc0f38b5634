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
    firsts: list[tuple[int, ...]] = []  # each episode's first prompt, in the order they asked
    killed: dict[str, object] = {}

    def script(request) -> str:
        ids = request.prompt_ids
        if not any(ids[: len(p)] == p for p in firsts):
            firsts.append(ids)
        elif len(firsts) >= 4 and not killed:  # a later turn, once four episodes run: kill, restart in the background
            killed["by"] = next(p for p in firsts if ids[: len(p)] == p)
            killed["started"] = len(firsts)
            server.kill()
            server.start(wait=False)
        return ADD_ONE

    env = OpenEnvEnvironment(server.url["counter"], connect_timeout=90)
    samples = [
        Sample(prompt=[{"role": "user", "content": f"Task {i}."}], task_name="c", row={"seed": 3 * i}) for i in range(8)
    ]
    result = await arollout(samples, {"c": env}, scripted(script), renderer, RolloutConfig(concurrency=4, max_turns=8))
    assert len(result.trajectories) == 8 and killed

    def first_prompt(t) -> tuple[int, ...]:
        return next(p for p in firsts if tuple(t.token_ids[: len(p)]) == p)

    failed = [t for t in result.trajectories if t.error is not None]
    for t in failed:  # were running when the server died: failed with the reason, tokens kept
        assert t.error.kind == "env_error" and "connection to the OpenEnv server" in t.error.message
        assert "lost" in t.error.message and len(t.token_ids) > t.prompt_length and t.turns < 5
    # which episodes had finished before the kill depends on timing; the one whose turn triggered it had not
    assert any(first_prompt(t) == killed["by"] for t in failed)
    for t in result.trajectories:
        if t.error is None:  # finished before the kill, or started after it on the restarted server
            assert t.terminated and t.total_reward == 1.0 and t.turns == 5
        if firsts.index(first_prompt(t)) >= killed["started"]:  # started after the crash: reconnected
            assert t.error is None
    assert 1 <= len(failed) <= 4 and result.metrics["errors"] == {"env_error": len(failed)}
