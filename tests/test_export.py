"""Export: trajectories (objects, records, files, run directories) to a ``datasets.Dataset``."""

from __future__ import annotations

import json

import pytest

from rollforge.chat.render import ChatRenderer
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.export import to_dataset
from rollforge.models import load_tokenizer
from rollforge.recipes.sft_data import expert_backend
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import rollout

pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def catch_run(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    renderer = ChatRenderer(tokenizer)
    spec = get_env_spec("catch")
    from rollforge.chat.toolcalls import get_parser

    result = rollout(
        spec.samples(3, 0),
        {"catch": spec.build()},
        expert_backend(spec.expert, renderer, get_parser()),
        renderer,
        RolloutConfig(max_turns=6),
    )
    return result.trajectories


def test_trajectories_become_rows_with_exact_tokens(catch_run):
    data = to_dataset(catch_run)
    assert len(data) == 3
    row, t = data[0], catch_run[0]
    assert row["token_ids"] == list(t.token_ids) and row["loss_mask"] == list(t.loss_mask)
    assert row["logprobs"] == list(t.logprobs)  # None off the mask, floats on it
    assert row["rewards"] == [0.0, 0.0, 0.0, 1.0] and row["total_reward"] == 1.0 and row["step"] is None
    assistant = row["messages"][2]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["name"] == "move"
    assert json.loads(assistant["tool_calls"][0]["arguments"])["direction"] in ("left", "right", "stay")
    assert row["messages"][3]["role"] == "tool" and row["messages"][3]["name"] == "move"
    assert row["error_kind"] is None and row["terminated"] is True


def test_files_and_training_run_directories(tmp_path, catch_run):
    folder = tmp_path / "run" / "trajectories"
    folder.mkdir(parents=True)
    for step in (1, 2):
        records = [{**t.to_json(), "reward": t.total_reward + step, "advantage": 0.5 * step} for t in catch_run]
        records[1]["error"] = {"kind": "env_error", "message": "boom"}
        (folder / f"step-{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = to_dataset(tmp_path / "run")
    assert len(data) == 6 and data["step"] == [1, 1, 1, 2, 2, 2]
    assert data["reward"] == [2.0, 2.0, 2.0, 3.0, 3.0, 3.0] and data["advantage"][3] == 1.0
    assert data["error_kind"][1] == "env_error" and data["error_message"][1] == "boom"
    assert len(to_dataset(folder / "step-000002.jsonl")) == 3
    with pytest.raises(ConfigError, match="no trajectories to export"):
        to_dataset([])
