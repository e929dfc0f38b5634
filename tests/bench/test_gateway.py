"""``rollforge bench gateway`` at a small size: every request answered, every session token-exact,
the keys computed from what was measured."""

import pytest

from rollforge.bench import gateway


@pytest.mark.timeout(180)
def test_gateway_bench_measures_both_runs(tiny_model_dir):
    result = gateway.run(sessions=8, turns=3, latency=0.1, tokenizer_dir=str(tiny_model_dir))
    assert result["requests"] == 24 and result["sessions_token_exact"] == 8
    assert result["direct_wall_seconds"] >= 0.3  # three sequential requests of 0.1 s
    assert result["ratio_gateway_to_direct"] == pytest.approx(
        result["gateway_wall_seconds"] / result["direct_wall_seconds"], rel=0.01
    )
    assert result["gateway_cpu_ms_per_request"] > 0


@pytest.mark.timeout(180)
def test_gateway_bench_over_the_responses_api(tiny_model_dir):
    result = gateway.run(sessions=4, turns=3, latency=0.1, tokenizer_dir=str(tiny_model_dir), api="responses")
    assert result["api"] == "responses" and result["requests"] == 12 and result["sessions_token_exact"] == 4
    assert result["ratio_gateway_to_direct"] == pytest.approx(
        result["gateway_wall_seconds"] / result["direct_wall_seconds"], rel=0.01
    )
