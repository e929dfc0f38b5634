"""``rollforge bench async-training`` on a few steps: its figures are computed from real runs."""

from types import SimpleNamespace

from rollforge.bench.async_training import main


def test_async_training_bench_reports_each_staleness():
    result = main(SimpleNamespace(steps=3, latency="auto", batch_size=2, group_size=4))  # two calibrations first
    assert result["latency_seconds"] >= 0
    runs = result["runs"]
    assert set(runs) == {"max_staleness_0", "max_staleness_1", "max_staleness_2"}
    for k in (0, 1, 2):
        run = runs[f"max_staleness_{k}"]
        assert run["token_lag_max"] <= k and run["dropped"] == 0
        assert run["wall_seconds"] > 0 and run["bound_seconds"] > 0
    assert runs["max_staleness_2"]["token_lag_max"] == 2  # three steps are enough to run two ahead
    assert result["ratio_async_to_sync"] == round(
        runs["max_staleness_1"]["wall_seconds"] / runs["max_staleness_0"]["wall_seconds"], 3
    )
    # the same requests whatever k: the scripted replies, and so the rewards, are the same
    assert len({run["mean_reward"] for run in runs.values()}) == 1


def test_auto_latency_makes_generation_take_the_updates_time():
    """Generation is not the latency: the engine's own CPU comes on top, and 64 episodes at a
    concurrency of 32 wait for two requests in turn. Worked by hand: at zero latency generation
    takes 0.05 s and the update 0.25 s; at latency 0.25 generation takes 0.55 s, so 2 s per second
    of latency, and (0.25 - 0.05) / 2 = 0.1 s of latency makes generation take 0.25 s."""
    from rollforge.bench.async_training import balanced_latency

    def steps(*generation):
        return [{"time/rollout": g, "time/score": 0.01, "time/update": 0.24, "time/sync": 0.0} for g in generation]

    assert round(balanced_latency(steps(0.04, 0.05, 0.06), steps(0.54, 0.55, 0.56), 0.25), 6) == 0.1
    assert balanced_latency(steps(0.3, 0.3), steps(0.8, 0.8), 0.25) == 0.0  # generation alone outlasts the update
