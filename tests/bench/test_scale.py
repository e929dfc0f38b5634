"""``rollforge bench scale`` at a small size: memory and timing keys computed from what was measured,
and the environment hook used for every episode."""

from __future__ import annotations

import pytest

from rollforge.bench import scale
from rollforge.bench.soak.probes import status_kb
from rollforge.envs.base import Environment


def test_scale_reports_memory_and_time_and_wraps_the_environment(tiny_model_dir):
    opened = []

    class Counting(Environment):  # what a wrap_environment hook returns: any Environment around the local one
        def __init__(self, env):
            self.env = env

        def open(self, sample):
            opened.append(sample)
            return self.env.open(sample)

        def __getattr__(self, name):
            return getattr(self.env, name)

    result = scale.run(
        episodes=300, turns=2, latency=0.05, trace=True, tokenizer_dir=str(tiny_model_dir), wrap_environment=Counting
    )
    assert len(opened) == 600  # the timed run and the traced run both use the wrapped environment
    assert result["turns_completed"] == 600 and result["errors"] == {} and result["tool_failures"] == {}
    wall, bound = result["wall_seconds"], result["lower_bound_seconds"]
    assert bound == pytest.approx(0.1) and wall >= bound
    assert result["ratio_to_lower_bound"] * bound == pytest.approx(wall, abs=1e-3)  # wall is rounded to ms
    assert result["engine_ms_per_turn"] == pytest.approx(1000 * (wall - bound) / 600, abs=0.01)
    before, peak = result["rss_before_mb"], result["peak_rss_mb"]
    assert 0 < before <= peak
    assert result["memory_per_episode_kb"] == pytest.approx((peak - before) * 1024 / 300, abs=0.5)
    assert result["tracemalloc_peak_kb_per_episode"] > 0
    assert result["engine_workers"] == 1 and result["worker_start_seconds"] == 0.0
    assert result["worker_start_cpu_seconds"] == [] and result["worker_cpu_seconds"] == 0.0


def test_status_fields_are_read_in_kilobytes():
    assert status_kb("VmHWM") >= status_kb("VmRSS") > 0


@pytest.mark.slow
def test_scale_with_the_environment_on_ray_actors(ray_session, tiny_model_dir):
    result = scale.run_on_ray(episodes=400, turns=2, latency=0.05, actors=2, tokenizer_dir=str(tiny_model_dir))
    assert result["executor"] == "ray" and result["env_actors"] == 2
    assert result["turns_completed"] == 800 and result["errors"] == {} and result["tool_failures"] == {}
    assert len(result["actor_peak_rss_mb"]) == 2 and all(mb > 0 for mb in result["actor_peak_rss_mb"])
    assert result["wall_seconds"] >= result["lower_bound_seconds"]
