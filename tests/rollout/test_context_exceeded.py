"""A prompt longer than the model's positions is the episode's own fault, never the machinery's.

Where the model is known before the first step (``rollforge rollout``/``eval``, training's
preflight) a ``max_seq_len`` over the model's positions, or a prompt over them, is refused in one
line naming both numbers, before the model loads. Where only the backend knows (the engine, given a
backend), the episode fails as ``context_exceeded``: a policy failure, never retried, whose message
names both numbers. The tiny test model handles 1,024 positions."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from transformers import AutoTokenizer

from rollforge.backends.base import Backend
from rollforge.backends.config import BackendConfig
from rollforge.chat.render import ChatRenderer
from rollforge.cli.main import main
from rollforge.cluster.generation import open_generation
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.errors import ConfigError, ContextExceeded
from rollforge.rollout.checks import model_positions
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.train.preflight import preflight
from rollforge.types import Sample

POSITIONS = 1024  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


class Answer(BaseSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        return Step(reward=1.0, terminated=True)


class Env(Environment):
    def open(self, sample):
        return Answer()


class ShortContext(Backend):
    """A model of ``positions`` positions that refuses every prompt as too long for it."""

    def __init__(self, positions: int):
        self.positions, self.calls = positions, 0

    async def generate(self, prompt_ids, params):
        self.calls += 1
        raise ContextExceeded(
            f"the prompt has {len(prompt_ids)} tokens but the model handles at most {self.positions} positions"
        )


async def test_a_prompt_the_backend_refuses_as_too_long_is_a_policy_failure_never_retried(renderer):
    backend = ShortContext(positions=8)
    batch = [Sample(prompt=[{"role": "user", "content": f"Task number {i}."}]) for i in range(3)]
    config = RolloutConfig(max_seq_len=4096, infra_retries=2)
    result = await asyncio.wait_for(arollout(batch, {"default": Env()}, backend, renderer, config), 30)
    assert backend.calls == 3  # once per episode: a rerun cannot fit the prompt in
    for t in result.trajectories:
        assert t.error.kind == "context_exceeded" and t.outcome == "policy_failure" and t.retries == 0
        assert re.match(r"the prompt has \d+ tokens but the model handles at most 8 positions; ", t.error.message)
        assert "max_seq_len" in t.error.message
    assert result.metrics["infra_retries"] == 0 and result.metrics["infra_failures"] == 0
    assert result.metrics["errors"] == {"context_exceeded": 3}


async def test_the_hf_backend_refuses_a_prompt_over_the_positions_as_context_exceeded(tiny_model_dir, renderer):
    """The issue's case: a prompt of about 1,090 tokens on a model of 1,024 positions, max_seq_len
    above them (the engine does not know the model): one failed request, no rerun."""
    batch = [Sample(prompt=[{"role": "user", "content": "word " * 540}])]
    config = RolloutConfig(max_seq_len=4096, max_new_tokens=4, infra_retries=2)
    generation = BackendConfig(kind="hf", model=str(tiny_model_dir))
    async with open_generation(generation, tokenizer=renderer.tokenizer) as backend:
        result = await asyncio.wait_for(arollout(batch, {"default": Env()}, backend, renderer, config), 120)
    [t] = result.trajectories
    assert t.error.kind == "context_exceeded" and t.retries == 0, t.error
    assert re.match(rf"the prompt has \d+ tokens but the model handles at most {POSITIONS} positions", t.error.message)


def test_max_seq_len_over_the_model_positions_is_refused_in_one_line_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before max_seq_len was checked")

    monkeypatch.setattr("rollforge.cluster.generation.open_generation", no_model)
    out = tmp_path / "out"
    capsys.readouterr()
    argv = ["rollout", "--model", str(tiny_model_dir), "--episodes", "1", "--max-seq-len", "2048", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "rollforge: error: --max-seq-len=2048 is more than the 1024 positions the model handles; "
        "set --max-seq-len to at most 1024\n"
    )
    assert not out.exists()


def test_a_prompt_over_the_model_positions_is_named_with_both_numbers(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """--max-seq-len left out is the model's 1,024 positions (below the default 2,048): a longer
    prompt is named with both numbers, and raising the flag is not what the message suggests."""
    monkeypatch.setattr("rollforge.cluster.generation.open_generation", None)  # never reached
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "word " * 540}) + "\n")
    capsys.readouterr()
    argv = ["rollout", "--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        r"rollforge: error: the model handles at most 1024 positions but prompt 1 is already (\d+) tokens; "
        r"shorten the prompts or use a model with a longer context\n",
        err,
    ), err
    assert int(re.search(r"already (\d+) tokens", err).group(1)) > POSITIONS


def test_training_preflight_refuses_max_seq_len_over_the_model_positions(tiny_config):
    config = tiny_config("rollout.max_seq_len=2048")
    with pytest.raises(ConfigError) as refused:
        preflight(config, [], resume=False, overwrite=False)
    assert str(refused.value) == (
        "rollout.max_seq_len=2048 is more than the 1024 positions the model handles; "
        "set rollout.max_seq_len to at most 1024"
    )
    preflight(tiny_config("rollout.max_seq_len=1024"), [], resume=False, overwrite=False)  # the positions: fits


def test_model_positions_are_read_from_the_config_without_loading_the_model(tiny_model_dir, tmp_path):
    assert model_positions(str(tiny_model_dir)) == POSITIONS
    vision = tmp_path / "vlm"
    vision.mkdir()
    (vision / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert model_positions(str(vision)) == 4096
    silent = tmp_path / "silent"
    silent.mkdir()
    (silent / "config.json").write_text(json.dumps({"model_type": "unknown"}))
    assert model_positions(str(silent)) is None
