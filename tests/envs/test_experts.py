"""Expert policies: their tool calls parse in each family's format, and their episodes, rolled out
through the engine with a scripted backend, reach full reward."""

from __future__ import annotations

import asyncio

import pytest

from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import PARSER_NAMES, get_parser
from rollforge.envs.experts import format_tool_call
from rollforge.envs.library import guess_number, wordle
from rollforge.errors import ConfigError
from rollforge.models import load_tokenizer
from rollforge.recipes.sft_data import environments_with_expert, expert_demonstrations
from rollforge.rollout.config import RolloutConfig
from rollforge.types import Message, ToolCall


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_format_tool_call_round_trips_through_the_parser(name):
    parser = get_parser(name)
    text = format_tool_call(parser, "move", {"direction": "left", "n": 2})
    assert parser.parse(text) == (ToolCall("move", {"direction": "left", "n": 2}),)


def test_format_tool_call_refuses_an_unknown_parser():
    class Other:
        def parse(self, text):
            return ()

    with pytest.raises(ConfigError, match="cannot write tool calls for parser Other"):
        format_tool_call(Other(), "move", {})


def test_bundled_tool_environments_have_experts():
    assert environments_with_expert() == ["echo", "calculator", "catch", "wordle", "guess_number", "shapes"]
    with pytest.raises(ConfigError, match="has no expert; environments with one"):
        asyncio.run(expert_demonstrations("arithmetic", 1, None, RolloutConfig()))


@pytest.mark.parametrize("parser", ["hermes", "llama3_json"])
@pytest.mark.parametrize(
    "env, episodes, most_turns", [("echo", 16, 2), ("catch", 16, 4), ("guess_number", 20, 5), ("wordle", 24, 6)]
)
def test_expert_episodes_reach_full_reward(tiny_model_dir, env, episodes, most_turns, parser):
    renderer = ChatRenderer(load_tokenizer(str(tiny_model_dir)))
    config = RolloutConfig(max_turns=8, max_seq_len=4096, tool_parser=parser)
    result = asyncio.run(expert_demonstrations(env, episodes, renderer, config, seed=3))
    assert [t.total_reward for t in result.trajectories] == [1.0] * episodes
    assert all(t.terminated and t.error is None and not t.failures for t in result.trajectories)
    assert max(t.turns for t in result.trajectories) <= most_turns
    # the policy tokens are exactly the expert's replies and their end-of-turn tokens
    t = result.trajectories[0]
    policy = renderer.decode([i for i, b in zip(t.token_ids, t.loss_mask) if b])
    replies = [m.content for m in t.messages if m.role == "assistant"]
    assert policy == "".join(r + "<|im_end|>" for r in replies)


def test_guess_number_expert_bisects_on_the_hints():
    opening = Message("user", guess_number.prompt_text())
    assert guess_number.expert([opening], get_parser()) == "10"
    history = [
        opening,
        Message("assistant", "10"),
        Message("user", "Too high."),
        Message("assistant", "4"),
        Message("user", "Too low."),
    ]
    assert guess_number.expert(history, get_parser()) == "7"  # open range 5..9


def test_wordle_opener_is_the_best_split_of_the_word_list():
    assert wordle._best_guess((), opener=None) == wordle.OPENER
