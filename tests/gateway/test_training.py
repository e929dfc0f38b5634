"""One GRPO step of the tiny model on an agent program that compacts its history: its sessions,
two segments each, are the trajectories trained on."""

import json
import textwrap

import pytest
import torch

from rollforge.recipes.launch import train
from rollforge.train.config import load_config

AGENT_MODULE = """
import openai

from rollforge.gateway import AgentEnvironment


async def agent(base_url, row):
    api = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    first = await api.chat.completions.create(model="policy", messages=row["prompt"], max_tokens=6)
    summary = "Summary: " + (first.choices[0].message.content or "")
    # The harness compacts: the next request replaces the history with a summary.
    second = await api.chat.completions.create(
        model="policy", messages=[{"role": "system", "content": summary}, {"role": "user", "content": "Go on."}], max_tokens=6)
    text = second.choices[0].message.content or ""
    return len(set(text)) / 6  # anything that differs between the samples of a group


policy = AgentEnvironment(agent)
"""


@pytest.mark.timeout(300)
def test_one_grpo_step_on_an_agent_program(tiny_model_dir, tmp_path):
    (tmp_path / "agent_module.py").write_text(textwrap.dedent(AGENT_MODULE))
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say something ({i})."}) + "\n" for i in range(4)))
    config = load_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'run'}",
            "steps=1",
            f"data.path={data}",
            f"environments=[{{name: '{tmp_path / 'agent_module.py'}:policy', task_name: agent}}]",
            "algorithm.batch_size=2",
            "algorithm.group_size=4",
            "rollout.max_new_tokens=8",
            "rollout.max_turns=2",
            "optim.lr=1e-2",
            "checkpoint_every=0",
        ]
    )
    before = {k: v.clone() for k, v in _weights(tiny_model_dir).items()}
    result = train(config, console=False)

    [metrics] = result.history
    assert not any(k.startswith("rollout/errors/") for k in metrics), metrics
    assert metrics["reward/std"] > 0 and metrics["grad_norm"] > 0
    records = [
        json.loads(line) for line in (result.out / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    ]
    assert len(records) == 8
    for record in records:
        assert record["turns"] == 2 and record["error"] is None and len(record["segments"]) == 2
        for segment in record["segments"]:  # each: the template's rendering of its request, then the reply
            prompt = segment["prompt_length"]
            assert segment["loss_mask"][:prompt] == [0] * prompt and 0 < sum(segment["loss_mask"][prompt:]) <= 6
            assert all(bit == 1 for bit in segment["loss_mask"][prompt:])
        assert record["total_reward"] == pytest.approx(record["reward"])
    trained = [r for r in records if r["advantage"]]  # a group whose rewards are all equal is not forwarded
    assert metrics["micro_batches"] >= 1 and metrics["policy_tokens"] == sum(sum(r["loss_mask"]) for r in trained)
    after = _weights(result.out / "checkpoints" / "step-000001")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step changed the policy


def _weights(directory):
    from safetensors.torch import load_file

    [file] = list(directory.glob("**/model.safetensors"))
    return load_file(file)
