"""A NeMo-RL environment, written against NeMo-RL's exact interface, runs unchanged through the
engine in both modes: its ``EnvironmentReturn`` (a NamedTuple with tensor rewards and terminateds,
``answers``, ``list[dict | None]`` metadata, ``list[list[str] | None]`` stop strings), its
"environment" observation role, and SPEC §1's stop-string and metadata semantics."""

from __future__ import annotations

import re
from typing import Any, NamedTuple, Optional

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.envs.stepwise import StepwiseEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Message, Sample

torch = pytest.importorskip("torch")
Tensor = torch.Tensor


class EnvironmentReturn(NamedTuple):  # nemo_rl/environments/interfaces.py, field for field
    observations: list[dict[str, str]]
    metadata: list[Optional[dict]]
    next_stop_strings: list[list[str] | None] | list[None]
    rewards: Tensor
    terminateds: Tensor
    answers: list[str | None] | None


class GuessEnvironment:
    """Guess ``metadata["target"]`` in ``<answer>N</answer>``; NeMo-RL style, batched.

    Continuing samples get ``next_stop_strings=["</answer>"]`` after the first turn, except that
    a guess of 0 returns None (which must keep the current stop strings) and None metadata
    (which must keep the current metadata). Reward: 1.0 for the right guess, -0.1 per wrong one."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def step(self, message_log_batch: list[list[dict[str, str]]], metadata: list[dict]) -> EnvironmentReturn:
        self.calls.append(
            {
                "size": len(message_log_batch),
                "keys": {tuple(sorted(m)) for log in message_log_batch for m in log},
                "metadata": [dict(m) for m in metadata],
            }
        )
        observations, new_metadata, stops, rewards, done, answers = [], [], [], [], [], []
        for log, info in zip(message_log_batch, metadata):
            found = re.findall(r"<answer>(\d+)</answer>", log[-1]["content"])
            guess = int(found[-1]) if found else None
            right = guess == info["target"]
            observations.append({"role": "environment", "content": "Correct!" if right else f"Wrong ({guess})."})
            if guess == 0:
                new_metadata.append(None)
                stops.append(None)
            else:
                new_metadata.append({**info, "guesses": info["guesses"] + 1})
                stops.append(["</answer>"])
            rewards.append(1.0 if right else -0.1)
            done.append(right)
            answers.append(str(guess) if right else None)
        return EnvironmentReturn(
            observations,
            new_metadata,
            stops,
            torch.tensor(rewards, dtype=torch.float32),
            torch.tensor(done, dtype=torch.bool),
            answers,
        )


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_nemo_rl_environment_runs_unchanged(renderer, mode):
    def script(request) -> str:  # guesses 0, 1, 2, ...: one more than the answers so far
        turn = renderer.decode(request.prompt_ids).count("</answer>")
        return f"<answer>{turn}</answer> trailing words"

    env = GuessEnvironment()
    targets = [1, 3, 2]
    samples = [
        Sample(
            prompt=[{"role": "user", "content": f"Guess the number, sample {i}."}],
            task_name="guess",
            row={"metadata": {"target": t, "guesses": 0}},
        )
        for i, t in enumerate(targets)
    ]
    result = await arollout(
        samples,
        {"guess": StepwiseEnvironment(env)},
        ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0]),
        renderer,
        RolloutConfig(mode=mode, max_turns=6, concurrency=3),
    )
    by_index = result.trajectories
    # guesses 0, 1, 2, ...: target t is found on turn t + 1; rewards -0.1 per wrong guess, then 1.0
    assert [t.turns for t in by_index] == [2, 4, 3]
    expected = [(-0.1, 1.0), (-0.1, -0.1, -0.1, 1.0), (-0.1, -0.1, 1.0)]  # float32 tensors: approx
    assert all(t.rewards == pytest.approx(e) for t, e in zip(by_index, expected))
    assert all(t.terminated for t in by_index)
    assert [pytest.approx(t.total_reward) for t in by_index] == [0.9, 0.7, 0.8]
    # turn 1 has no stop strings, so its trailing text stays; guess 0 returned None stop strings,
    # which keep the current (empty) ones; from the second step on, "</answer>" cuts the reply
    replies = [m.content for m in by_index[1].messages if m.role == "assistant"]
    assert replies[0] == "<answer>0</answer> trailing words" and replies[1] == "<answer>1</answer> trailing words"
    assert replies[2:] == ["<answer>2</answer>", "<answer>3</answer>"]
    # NeMo-RL's "environment" role is a user message
    assert by_index[0].messages[-1] == Message("user", "Correct!")
    # metadata: None kept the current one after guess 0; every later step's metadata was handed back
    assert by_index[1].metadata == {"target": 3, "guesses": 3}
    seen = [m for call in env.calls for m in call["metadata"] if m["target"] == 3]
    assert [m["guesses"] for m in seen] == [0, 0, 1, 2]
    # the environment only ever saw role + content, and in lockstep one batch per turn of the survivors
    assert all(call["keys"] == {("content", "role")} for call in env.calls)
    if mode == "lockstep":
        assert [call["size"] for call in env.calls] == [3, 3, 2, 1]
    for t in by_index:
        assert token_fidelity_gap(t, renderer) is None
