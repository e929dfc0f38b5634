"""The tool-call fuzz (rollforge.bench.fuzz): malformed calls through the real engine are counted
failures, never failed episodes, and the fuzzer's expectations are right call by call."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from rollforge.bench.fuzz import FAMILIES, make_case, run
from rollforge.chat.toolcalls import get_parser
from rollforge.cli.main import main
from rollforge.errors import ConfigError


def test_every_fuzzed_reply_parses_as_the_fuzzer_expects():
    """The generator's own check, parser by parser (fast, no engine): a reply meant to be
    malformed JSON is exactly one error call, any other reply exactly one readable call."""
    rng = random.Random(7)
    seen: Counter[tuple[str, str]] = Counter()
    for family in FAMILIES:
        parser = get_parser(family)
        for _ in range(3000):
            case = make_case(family, rng)
            calls = parser.parse(case.text)
            assert len(calls) == 1, (family, case)
            assert (calls[0].error is not None) == (case.expected == "tool_invalid_json"), (family, case, calls)
            seen[family, case.mutation] += 1
    assert len(seen) == len(FAMILIES) * 9  # every mutation in every family


def test_fuzz_through_the_engine_fails_no_episode(tiny_model_dir):
    result = run(calls=5800, seed=0, tokenizer_dir=str(tiny_model_dir))
    assert result["invariant_violations"] == 0, result["violation_examples"]
    assert result["failed_episodes"] == 0
    malformed = sum(result["expected_failures_by_kind"].values())
    assert malformed >= 5000
    # every malformed call was counted, as the kind of failure it is
    assert result["failures_by_kind"] == result["expected_failures_by_kind"]
    assert set(result["failures_by_kind"]) == {"tool_invalid_json", "tool_unknown", "tool_bad_arguments"}
    assert sum(result["mutations"].values()) == 5800


def test_bench_fuzz_cli_prints_the_counts(capsys, tiny_model_dir):
    assert main(["bench", "fuzz", "--calls", "60", "--seed", "3", "--tokenizer", str(tiny_model_dir)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["calls"] == 60 and result["seed"] == 3 and sum(result["calls_per_family"].values()) == 60
    assert result["failed_episodes"] == 0 and result["invariant_violations"] == 0
    assert result["failures_by_kind"] == result["expected_failures_by_kind"] and result["ms_per_call"] > 0


def test_same_seed_same_cases():
    def cases(seed):
        rng = random.Random(seed)
        return [make_case(family, rng) for family in FAMILIES for _ in range(20)]

    assert cases(1) == cases(1) and cases(1) != cases(2)


def test_too_few_calls_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"--calls must be an integer of at least 6 \(one per family\), got 0"):
        run(calls=0)
