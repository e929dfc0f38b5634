"""GRPO end to end on the tiny model: the reward rises from chance to above 0.9."""

import json
import statistics

from rollforge.train.loop import train


def test_tiny_model_learns_to_read_the_prompt(tiny_config):
    config = tiny_config("steps=40", "save_trajectories=false")
    result = train(config, console=False)
    rewards = [m["reward/mean"] for m in result.history]
    assert len(rewards) == 40
    assert statistics.fmean(rewards[:3]) < 0.35  # near chance at the start
    best = max(statistics.fmean(rewards[i : i + 3]) for i in range(len(rewards) - 2))
    assert best > 0.9, rewards
    lines = (result.out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 41))
