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


def test_auto_latency_equals_a_steps_local_work():
    """The engine and the update share one interpreter: overlap hides only the remote wait behind
    the local work (the update, and generating's own CPU at zero latency), best when the two are
    equal. A latency of the update time alone left the engine's CPU out (best ratio 0.65, not 0.5)."""
    from rollforge.bench.async_training import balanced_latency

    steps = [{"time/rollout": g, "time/score": 0.01, "time/update": u, "time/sync": 0.0}
             for g, u in ((0.20, 0.24), (0.22, 0.25), (0.21, 0.23))]
    assert round(balanced_latency(steps), 6) == 0.47  # median update 0.25 + 0.01 scoring, median engine CPU 0.21
