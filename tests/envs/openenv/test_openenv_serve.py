"""`rollforge env serve catch` is a real OpenEnv server: openenv's own client (and a TRL-style
environment class wrapping it) plays it, and rollforge's client gets the local trajectories."""

from __future__ import annotations

import re
from typing import Literal

import pytest

from rollforge.chat.render import token_fidelity_gap
from rollforge.cli.main import main
from rollforge.envs.check import acheck_env
from rollforge.envs.library import catch
from rollforge.envs.openenv import OpenEnvEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout

pytestmark = pytest.mark.slow

POSITIONS = re.compile(r"Ball: column (\d), row \d of 5\. Paddle: column (\d)")


def best_move(text: str) -> str:
    ball, paddle = (int(x) for x in POSITIONS.findall(text)[-1])
    return "left" if paddle > ball else "right" if paddle < ball else "stay"


def test_env_list_prints_names_and_descriptions(capsys):
    assert main(["env", "list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^catch +Move a paddle under a falling ball", out, re.M)


def test_openenv_client_and_a_trl_style_class_play_served_catch(catch_url):
    from openenv.core.generic_client import GenericEnvClient

    with GenericEnvClient(base_url=catch_url).sync() as client:
        result = client.reset(seed=7)
        assert [t["function"]["name"] for t in result.observation["tools"]] == ["move"]
        while not result.done:
            action = {
                "tool_calls": [{"name": "move", "arguments": {"direction": best_move(result.observation["text"])}}]
            }
            result = client.step(action)
        assert result.reward == 1.0 and "you caught it!" in result.observation["text"]

    class RemoteCatch:  # what a TRL `environment_factory` class around the OpenEnv client looks like
        def __init__(self):
            self.client = GenericEnvClient(base_url=catch_url).sync()
            self.client.connect()
            self.done, self.reward = False, 0.0

        def reset(self, seed: int) -> str:
            result = self.client.reset(seed=seed)
            self.done = False
            return result.observation["text"]

        def move(self, direction: Literal["left", "right", "stay"]) -> str:
            result = self.client.step({"tool_calls": [{"name": "move", "arguments": {"direction": direction}}]})
            self.done, self.reward = result.done, result.reward or 0.0
            return result.observation["text"]

    env = RemoteCatch()
    try:
        for seed in (1, 2, 3):
            text = env.reset(seed=seed)
            while not env.done:
                text = env.move(best_move(text))
            assert env.reward == 1.0
        env.reset(seed=4)
        assert "Error" in env.move("up") and not env.done  # the served tool validates its enum
    finally:
        env.client.close()


def catch_player(renderer):
    """A scripted policy that moves the paddle under the ball every turn."""

    def play(request) -> str:
        direction = best_move(renderer.decode(request.prompt_ids[-120:]))
        return f'<tool_call>\n{{"name": "move", "arguments": {{"direction": "{direction}"}}}}\n</tool_call>'

    return play


async def test_rollforge_client_on_served_catch_matches_the_local_environment(catch_url, renderer, scripted):
    play = catch_player(renderer)
    samples = catch.samples(6, seed=11)
    config = RolloutConfig(max_turns=6, concurrency=3)
    local = await arollout(samples, {"catch": catch.build()}, scripted(play), renderer, config)
    remote = await arollout(samples, {"catch": OpenEnvEnvironment(catch_url)}, scripted(play), renderer, config)
    for x, y in zip(local.trajectories, remote.trajectories):
        assert (x.token_ids, x.loss_mask, x.logprobs, x.rewards, x.messages, x.tools) == (
            y.token_ids,
            y.loss_mask,
            y.logprobs,
            y.rewards,
            y.messages,
            y.tools,
        )
        assert y.terminated and y.total_reward == 1.0 and token_fidelity_gap(y, renderer) is None


@pytest.mark.slow
async def test_openenv_client_on_ray_actors_matches_the_local_environment(catch_url, renderer, scripted, ray_session):
    from rollforge.cluster.env_pool import RayEnvironmentPool

    play = catch_player(renderer)
    samples = catch.samples(6, seed=11)
    config = RolloutConfig(max_turns=6, concurrency=6)
    local = await arollout(samples, {"catch": catch.build()}, scripted(play), renderer, config)
    pool = RayEnvironmentPool(OpenEnvEnvironment(catch_url), actors=2, num_cpus=0, name="catch")
    try:
        remote = await arollout(samples, {"catch": pool}, scripted(play), renderer, config)
    finally:
        pool.shutdown()
    for x, y in zip(local.trajectories, remote.trajectories, strict=True):
        assert (x.token_ids, x.loss_mask, x.logprobs, x.rewards, x.messages, x.tools) == (
            y.token_ids,
            y.loss_mask,
            y.logprobs,
            y.rewards,
            y.messages,
            y.tools,
        )
        assert y.terminated and y.total_reward == 1.0


async def test_check_env_passes_for_served_catch_through_the_client(catch_url):
    await acheck_env(OpenEnvEnvironment(catch_url), samples=catch.samples(2, seed=3), steps=6)
