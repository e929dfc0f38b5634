"""A family member that does not exist or cannot be played (``gymnasium:CartPole-v1`` has no text
rendering) is refused with the family's own one-line error, in ``rollforge rollout`` and
``rollforge train``, with and without prompts from a file; it used to be read as an import path
("has no prompt generator", "module 'gymnasium' has no attribute 'CartPole-v1'")."""

from __future__ import annotations

import json

import pytest
import yaml

from rollforge.cli.main import main
from rollforge.envs.adapters import unknown_item
from rollforge.inputs.environments import is_bundled

CASES = [
    ("gymnasium", "gymnasium:CartPole-v1", "gymnasium environment 'CartPole-v1' has no text rendering"),
    ("gymnasium", "gymnasium:CartPol-v1", "unknown gymnasium environment 'CartPol-v1'; close names: CartPole-v1"),
    (
        "reasoning_gym",
        "reasoning_gym:leg_countin",
        "unknown reasoning_gym dataset 'leg_countin'; close names: leg_counting",
    ),
    ("textarena", "textarena:Nope-v0", "unknown textarena game 'Nope-v0'; known names start with: "),
]


def test_unknown_items_name_close_or_known_names():
    assert str(unknown_item("game", "Wordle-v9", ["Wordle-v0", "Chess-v0"])) == (
        "unknown game 'Wordle-v9'; close names: Wordle-v0"
    )
    assert str(unknown_item("game", "Nope", ["b", "a"])) == "unknown game 'Nope'; known names: a, b"
    many = [f"Game{i:02d}-v{v}" for i in range(20) for v in (0, 1)]
    assert str(unknown_item("game", "Nope", many)).endswith("Game18, Game19 (40 names in all)")


def test_family_names_are_never_import_paths():
    assert is_bundled("gymnasium:CartPole-v1") and is_bundled("textarena:Nope-v0")
    assert not is_bundled("my_module:MyEnv") and not is_bundled("http://127.0.0.1:8000")


def one_line_error(capsys, argv, expected):
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and expected in err, err


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Play."}) + "\n")
    return path


@pytest.mark.parametrize("library,name,expected", CASES)
def test_rollout_shows_the_familys_own_error(library, name, expected, prompts, tmp_path, capsys):
    pytest.importorskip(library)
    argv = ["rollout", "--model", str(tmp_path / "never-loaded"), "--env", name, "--out", str(tmp_path / "out")]
    one_line_error(capsys, argv, expected)
    one_line_error(capsys, [*argv, "--data", str(prompts)], expected)


@pytest.mark.parametrize("library,name,expected", CASES)
def test_train_shows_the_familys_own_error(library, name, expected, prompts, tiny_config, tmp_path, capsys):
    pytest.importorskip(library)
    for data in (str(prompts), None):
        config = tiny_config(f"environments=[{{name: '{name}'}}]").model_dump(mode="json")
        config["data"]["path"] = data
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(config))
        one_line_error(capsys, ["train", str(path)], expected)
