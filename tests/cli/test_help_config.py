"""``--help-config`` of ``train`` and ``sft`` (one printer, ``train.config_files.describe_config``): every
key under its own heading, with the default it really has, list items (``sources``) included; and a
section's own defaults survive setting one of its keys."""

from __future__ import annotations

import pytest

from rollforge.cli.main import main
from rollforge.recipes.sft_config import load_sft_config
from rollforge.train.config import load_config


def help_config(capsys, command: str) -> list[str]:
    capsys.readouterr()
    assert main([command, "--help-config"]) == 0
    return capsys.readouterr().out.splitlines()


def under(lines: list[str], heading: str) -> list[str]:
    """The key names listed under ``heading``, up to the next heading."""
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return [line.split(" = ")[0].strip() for line in lines[start:end]]


def test_train_help_config_puts_each_key_under_its_section(capsys):
    lines = help_config(capsys, "train")
    headings = [line.split("  #")[0] for line in lines if not line.startswith("  ")]
    assert headings == [
        "top-level keys:",
        "model:",
        "lora:",
        "environments: a list (default [{'name': 'arithmetic'}]); each item has these keys; "
        "--set environments=[{...}] sets it whole",
        "environments[] items:",
        "data:",
        "rewards: a list (default []); each item has these keys; --set rewards=[{...}] sets it whole",
        "rewards[] items:",
        "algorithm:",
        "optim:",
        "rollout:",
        "ray:",
        "vllm:",
    ]
    assert under(lines, "top-level keys:") == [
        "out",
        "steps",
        "seed",
        "executor",
        "checkpoint_every",
        "keep_checkpoints",
        "save_trajectories",
        "report_to",
        "eval_episodes",
        "eval_every",
    ]
    assert under(lines, "rewards[] items:") == ["rewards[].function", "rewards[].weight", "rewards[].options"]
    assert all(key.startswith("rollout.") for key in under(lines, "rollout:"))
    assert "  rollout.max_turns = 4  # Assistant turns per episode" in "\n".join(
        lines
    )  # training's default, not the class's 8


def test_sft_help_config_lists_the_keys_of_each_kind_of_source(capsys):
    lines = help_config(capsys, "sft")
    headings = [line.split("  #")[0] for line in lines if not line.startswith("  ")]
    assert headings == [
        "top-level keys:",
        "model:",
        "lora:",
        "optim:",
        "sources: a list (default []); each item has a kind and that kind's keys; --set sources=[{...}] sets it whole",
        "sources[] items of kind 'trajectories':",
        "sources[] items of kind 'messages':",
        "sources[] items of kind 'expert':",
        "from_rollouts:",
        "from_rollouts.environments: a list (default [{'name': 'catch'}]); each item has these keys; "
        "--set from_rollouts.environments=[{...}] sets it whole",
        "from_rollouts.environments[] items:",
        "rollout:",
    ]
    assert under(lines, "sources[] items of kind 'expert':") == [
        "sources[].env",
        "sources[].episodes",
        "sources[].min_reward",
        "sources[].options",
    ]
    assert under(lines, "sources[] items of kind 'trajectories':") == ["sources[].path", "sources[].min_reward"]
    assert "  optim.lr = 0.0001  # Peak learning rate of AdamW." in lines  # SFT's default, not the class's 1e-05
    undocumented = [line for line in lines if line.startswith("  ") and "  # " not in line]
    assert undocumented == []


@pytest.mark.parametrize(
    "load, override, kept",
    [
        (load_config, "rollout.max_new_tokens=128", ("rollout", "max_turns", 4)),
        (load_config, "rollout.max_new_tokens=128", ("rollout", "concurrency", 32)),
        (load_sft_config, "optim.warmup_steps=5", ("optim", "lr", 1e-4)),
    ],
)
def test_setting_one_key_of_a_section_keeps_the_sections_other_defaults(load, override, kept):
    section, key, value = kept
    assert getattr(getattr(load(), section), key) == value
    assert getattr(getattr(load(overrides=[override]), section), key) == value
