"""What a training run prints while it runs: a step line that says when no optimizer step ran, an
SFT line without the sources' ``phase 0``, and a heartbeat line while a step runs long (driven by a
clock of the test's own: no sleeps)."""

from __future__ import annotations

from rollforge.train.logbook import Heartbeat, Logbook, console_line, sft_line
from rollforge.train.report import summary

STEP = {
    "step": 2,
    "reward/mean": 0.0,
    "reward/env/first": 0.0,
    "loss": 0.0,
    "kl": 0.0,
    "clip_fraction": 0.0,
    "grad_norm": 0.0,
    "advantage/groups": 4,
    "advantage/zero_variance_groups": 4,
    "micro_batches": 0,
    "time/step": 3.0,
    "time/rollout": 2.5,
    "time/update": 0.1,
}


def test_a_step_without_an_optimizer_step_says_why_instead_of_a_loss():
    assert console_line(STEP, 3) == (
        "step    2/3  reward 0.000  [first 0.00]  no update: all 4 groups had equal rewards  "
        "3.0s (gen+env 2.5s, train 0.1s)"
    )
    failed = {**STEP, "advantage/zero_variance_groups": 3}  # the fourth group's episodes all failed
    assert "no update: no episode had a token with a learning signal" in console_line(failed, 3)
    updated = {**STEP, "micro_batches": 2, "loss": -0.5, "grad_norm": 1.25}
    assert "loss -0.5000  kl 0.0000  clip 0.000  gnorm 1.250" in console_line(updated, 3)


def test_the_summary_counts_updates_and_names_the_steps_without_one():
    history = [
        {**STEP, "step": 1, "reward/mean": 0.25, "micro_batches": 2},
        {**STEP, "step": 2},
        {**STEP, "step": 3, "reward/mean": 0.75, "micro_batches": 1},
    ]
    assert summary(history, "runs/x", since=0, wall_seconds=41.2) == (
        "trained 3 steps (1-3), 2 optimizer updates (no update in 1 step: all 4 groups had equal rewards); "
        "reward/mean 0.250 (step 1) -> 0.750 (step 3); wall time 41s\nrun: runs/x (rollforge view runs/x)"
    )
    assert summary(history, "runs/x", since=3).startswith("no step was trained; run: runs/x")
    assert summary(history, "runs/x", since=2).startswith("trained 1 step (3-3), 1 optimizer update; ")


def test_an_sft_line_names_rejection_sampling_rounds_but_not_the_sources_phase():
    step = {"step": 5, "phase": 0, "loss": 1.5, "grad_norm": 0.5, "loss_tokens": 40, "tokens": 90, "time/step": 2.0}
    assert sft_line(step, 16) == "sft step    5/16  loss 1.5000  gnorm 0.500  tokens 40/90  2.00s"
    assert console_line(step, 16) == sft_line(step, 16)
    assert "sft step    6/16  round 1  loss" in sft_line({**step, "step": 6, "phase": 1}, 16)


def test_the_heartbeat_speaks_after_every_silent_interval_with_the_rollouts_progress():
    now, lines = [100.0], []
    beat = Heartbeat(10, start_step=3, every=30.0, clock=lambda: now[0], write=lines.append)
    on_episode = beat.rolling(32)
    for _ in range(12):
        on_episode(object())
    now[0] = 129.0
    assert beat.poll() is None  # 29 s: not yet
    now[0] = 130.0
    assert beat.poll() == "  ... step 4/10: rollout 12/32 episodes, 30s so far"
    now[0] = 150.0
    assert beat.poll() is None  # 20 s after the last line
    for _ in range(20):
        on_episode(object())
    now[0] = 160.0
    assert beat.poll() == "  ... step 4/10: rolled out 32 episodes, updating, 60s so far"
    beat.step_done(4)  # the step's own line was printed: silence counts from here
    now[0] = 189.0
    assert beat.poll() is None
    now[0] = 190.0
    assert beat.poll() == "  ... step 5/10, 30s so far"
    beat.step_done(10)
    now[0] = 220.0
    assert beat.poll() == "  ... finishing after step 10/10, 30s so far"
    assert len(lines) == 4


def test_the_first_steps_clock_starts_at_its_rollout_not_at_the_evaluation_before_it():
    now, lines = [0.0], []
    beat = Heartbeat(7, every=30.0, clock=lambda: now[0], write=lines.append)
    now[0] = 25.0  # the held-out evaluation before step 1 took 25 s, quietly
    beat.rolling(32)
    now[0] = 54.0
    assert beat.poll() is None  # 29 s into the rollout
    now[0] = 55.0
    assert beat.poll() == "  ... step 1/7: rollout 0/32 episodes, 30s so far"
    beat.rolling(8)  # dynamic sampling's second round: the step's clock runs on
    now[0] = 85.0
    assert beat.poll() == "  ... step 1/7: rollout 0/8 episodes, 60s so far"


def test_a_console_logbook_beats_until_it_is_closed(tmp_path):
    logbook = Logbook(tmp_path, total_steps=2, console=True, report_to=[])
    assert logbook.heartbeat is not None and logbook.heartbeat._thread.is_alive()
    assert logbook.rolling(8) == logbook.heartbeat.episode and logbook.heartbeat.episodes == (0, 8)
    logbook.close()
    assert not logbook.heartbeat._thread.is_alive()
    quiet = Logbook(tmp_path / "quiet", total_steps=2, console=False, report_to=[])
    assert quiet.heartbeat is None and quiet.rolling(8) is None
    quiet.close()
