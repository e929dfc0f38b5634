"""``rollforge bench soak`` at a small size: every episode is written once to a whole ``.partial``
file, and each injected fault is counted as the fault it is. (Memory, thread and fd figures are
reported, not asserted: at this size there is no steady state to compare.)"""

from __future__ import annotations

import json

from rollforge.bench import soak
from rollforge.bench.soak import SoakSettings, expected_counts
from rollforge.bench.soak.probes import check_partial
from rollforge.cli.main import main as cli_main


def test_every_episode_is_written_and_every_fault_counted_as_injected(tmp_path):
    result = soak.run(SoakSettings(episodes=300, chunk=100, concurrency=16), out=tmp_path)
    # 300 episodes, 30 periods of the mix: 5 normal, 1 each of raising, broken, hanging, slow, huge
    assert result["expected"]["kinds"] == {
        "broken": 30, "hanging": 30, "huge": 30, "normal": 150, "raising": 30, "slow": 30,
    }  # fmt: skip
    assert result["errors"] == {"env_error": 30, "env_timeout": 30}  # broken resets, hung tools
    assert result["tool_failures"] == {"tool_raised": 30}  # the raising tools, reported to the model
    assert result["faults_as_injected"] and result["on_episode_errors"] == 0
    assert result["chunks"] == 3 and result["every_trajectory_written"]
    partial = result["partial"]
    assert partial["whole"] and partial["lines"] == 300 and partial["distinct_indices"] == 300
    assert partial["missing_indices"] == partial["duplicate_indices"] == partial["unexpected_endings"] == 0
    # what the file holds: the 150 normal + 30 raising + 30 slow end terminated, the huge ones truncated
    assert partial["endings"] == {"env_error": 30, "env_timeout": 30, "terminated": 210, "truncated": 30}
    assert result["backend_calls"] == 300 - 30 + 30  # the 30 broken ones never generate; the 30 raising ones twice
    assert result["partial_path"] == str(tmp_path / "trajectories.jsonl.partial")


def test_the_expected_counts_follow_the_mix():
    assert expected_counts(12) == {
        "kinds": {"broken": 1, "hanging": 1, "huge": 1, "normal": 7, "raising": 1, "slow": 1},
        "errors": {"env_error": 1, "env_timeout": 1},
        "tool_failures": {"tool_raised": 1},
    }


def test_a_torn_or_duplicated_partial_file_is_not_whole(tmp_path):
    path = tmp_path / "trajectories.jsonl.partial"
    record = {"index": 0, "terminated": True, "error": None, "failures": []}
    path.write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n" + '{"index": 1, "termin')
    found = check_partial(path, 2)
    assert not found.whole and not found.ends_in_newline and found.unparsable_lines == 1
    assert found.duplicate_indices == 1 and found.missing_indices == 1 and found.unexpected_endings == 0


def test_the_command_prints_the_figures(capsys):
    assert cli_main(["bench", "soak", "--episodes", "20", "--chunk", "10", "--concurrency", "4"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["benchmark"] == "soak" and printed["every_trajectory_written"] and printed["faults_as_injected"]
    assert printed["partial_path"] is None  # a temporary directory, removed
