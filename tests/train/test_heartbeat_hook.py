"""The training loop tells the heartbeat how far a step's rollout has got (episodes done / total)."""

from rollforge.recipes.launch import train
from rollforge.train.logbook import Logbook


def test_the_rollout_counts_its_episodes_for_the_heartbeat(tiny_config, monkeypatch):
    seen, log = [], Logbook.log

    def counted(self, metrics):
        seen.append(self.heartbeat.episodes)  # when the step's line is written: its rollout is done
        log(self, metrics)

    monkeypatch.setattr(Logbook, "log", counted)
    train(tiny_config("steps=2"), console=True)
    assert seen == [(32, 32), (32, 32)]  # 4 prompts x 8 rollouts per step
