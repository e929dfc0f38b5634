"""Training fixtures: a fast config on the tiny model and the learnable FirstCharacter task."""

from __future__ import annotations

import json

import pytest

from rollforge.testing import first_character_rows
from rollforge.train.config import load_config


@pytest.fixture
def first_character_data(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in first_character_rows(64)))
    return path


@pytest.fixture
def tiny_config(tiny_model_dir, tmp_path, first_character_data):
    """``make(*overrides)``: a fast training config on the tiny model and FirstCharacter."""

    def make(*overrides: str):
        return load_config(overrides=[
            f"model.name={tiny_model_dir}", f"out={tmp_path / 'run'}", "steps=3", f"data.path={first_character_data}",
            "environments=[{name: 'rollforge.testing:FirstCharacter', task_name: first}]",
            "algorithm.batch_size=4", "algorithm.group_size=8", "rollout.max_new_tokens=2", "rollout.max_turns=1",
            "optim.lr=1e-3", "checkpoint_every=0", *overrides,
        ])

    return make
