"""``rollforge bench long-horizon`` at a small size: every episode runs all its turns, render time is
attributed per episode turn, and the incremental ids equal a full re-rendering."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from rollforge.bench import long_horizon as bench
from rollforge.chat.render import ChatRenderer
from rollforge.types import Message


def test_long_episodes_reach_every_turn_and_render_incrementally(tiny_model_dir):
    result = bench.run(episodes=4, turns=24, latency=0.0, per_token_latency=0.0, tokenizer_dir=str(tiny_model_dir))
    assert result["turns_completed"] == 96 and result["every_episode_reached_max_turns"]
    assert result["errors"] == {} and result["tool_failures"] == {}
    assert result["full_rerender_matches"]  # the incremental ids are the template's, token for token
    assert result["render_seconds_off_loop"] > 0  # long tool results were tokenized on the render thread
    assert 0 < result["render_seconds"] < result["wall_seconds"]
    assert result["render_fraction"] == pytest.approx(result["render_seconds"] / result["wall_seconds"], rel=0.02)
    assert result["render_ms_per_turn_turns_1_3"] > 0 and result["render_ms_per_turn_turns_22_24"] > 0
    # re-rendering everything every turn is quadratic, rendering each turn's messages linear: the
    # benchmark reports both times; comparing two measured times is not asserted (load could flip it)
    assert result["full_rerender_seconds_per_episode"] > 0 and result["render_seconds_per_episode"] > 0


def test_timed_renderer_counts_turns_per_episode_task(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer, plain = bench.TimedRenderer(tokenizer), ChatRenderer(tokenizer)
    prompt = (Message("user", "hi"),)

    async def episode(turns: int) -> None:
        assert renderer.prompt_ids(prompt) == plain.prompt_ids(prompt)
        for _ in range(turns):
            generated = renderer.encode("ok") + [renderer.stop_token_ids[0]]
            assert renderer.content_ids(generated) == plain.content_ids(generated)
            assert renderer.delta_ids([Message("tool", "result", name="f")]) == plain.delta_ids(
                [Message("tool", "result", name="f")]
            )

    async def main() -> None:
        renderer.check_template(prompt)
        await asyncio.gather(episode(2), episode(5))

    asyncio.run(main())
    assert sorted(renderer.per_turn) == list(range(6))  # turns count per episode, not globally (7)
    assert all(seconds > 0 for seconds in renderer.per_turn.values())
