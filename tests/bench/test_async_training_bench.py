"""``rollforge bench async-training`` on a few steps: its figures are computed from real runs."""

from types import SimpleNamespace

from rollforge.bench.async_training import main


def test_async_training_bench_reports_each_staleness():
    result = main(SimpleNamespace(steps=3, latency="0.05", batch_size=2, group_size=4))
    runs = result["runs"]
    assert set(runs) == {"max_staleness_0", "max_staleness_1", "max_staleness_2"}
    for k in (0, 1, 2):
        run = runs[f"max_staleness_{k}"]
        assert run["token_lag_max"] <= k and run["dropped"] == 0
        assert run["wall_seconds"] > 0 and run["bound_seconds"] > 0
    assert runs["max_staleness_2"]["token_lag_max"] == 2  # three steps are enough to run two ahead
    assert result["ratio_async_to_sync"] == round(runs["max_staleness_1"]["wall_seconds"]
                                                  / runs["max_staleness_0"]["wall_seconds"], 3)
    # the same requests whatever k: the scripted replies, and so the rewards, are the same
    assert len({run["mean_reward"] for run in runs.values()}) == 1
