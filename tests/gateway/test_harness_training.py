"""One GRPO step of the tiny model on top of each agent harness (smolagents ``CodeAgent`` and
``ToolCallingAgent``; openai-agents over the Responses API; a langgraph react agent over
langchain-openai; mini-swe-agent's update is in test_mini_swe_agent.py): the harness runs unchanged through
``AgentEnvironment``, its sessions are the trajectories trained on, its own final answer is the
reward, and the step changes the weights.

The policy is scripted (the tiny model cannot write tool calls), with the trained model's own
logprobs of the scripted tokens, so the step's importance ratios start at 1 as on-policy. Each
episode's answer is right or wrong by its sampling seed, so a group's rewards differ."""

import json
import shutil

import pytest
import torch
from gateway_helpers import CALL_TEXT, reply_for

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.gateway import AgentEnvironment
from rollforge.recipes.launch import train
from rollforge.train.config import load_config
from rollforge.train.logprobs import sequence_logprobs
from rollforge.types import Completion, Trajectory

pytestmark = pytest.mark.timeout(300)


class TeacherForcedPolicy(ScriptedBackend):
    """Scripted replies scored by the model being trained: it "generates with" that model (the
    run hands it over through ``shares_model``), so pushes need no weight sync."""

    model = None

    def shares_model(self, model):
        self.model = model
        return True

    async def generate(self, prompt_ids, params):
        completion = await super().generate(prompt_ids, params)
        ids = torch.tensor([list(prompt_ids) + list(completion.token_ids)])  # (1, T)
        targets = torch.zeros_like(ids, dtype=torch.bool)
        targets[0, len(prompt_ids) :] = True
        with torch.no_grad():
            logprobs = sequence_logprobs(self.model, ids, torch.ones_like(ids), targets)[0, len(prompt_ids) :]
        return Completion(completion.token_ids, tuple(logprobs.tolist()), completion.finish_reason)


def long_context(model_dir, out):
    """A copy of the tiny model that handles 8,192 positions instead of 1,024, as the harnesses'
    own prompts need (training refuses a max_seq_len over the model's positions); its rotary
    embeddings have no table that depends on the number, so the weights are the same."""
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    return out


def one_grpo_step(tmp_path, tiny_model_dir, agent, script):
    """Trains one step (one prompt, a group of two episodes) on ``AgentEnvironment(agent)`` with
    the scripted policy, checks that it trained on the recorded trajectories and changed the
    weights, and returns those trajectories."""
    from transformers import AutoTokenizer

    tiny_model_dir = long_context(tiny_model_dir, tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = ChatRenderer(tokenizer)
    backend = TeacherForcedPolicy(
        lambda request: script(renderer.decode(request.prompt_ids), request.params.seed), tokenizer
    )
    config = load_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            f"out={tmp_path / 'run'}",
            "steps=1",
            "algorithm.batch_size=1",
            "algorithm.group_size=2",
            "rollout.max_new_tokens=64",
            "rollout.max_seq_len=8192",
            "rollout.max_turns=3",
            "optim.lr=1e-2",
            "checkpoint_every=0",
        ]
    )
    dataset = [{"prompt": "What is 1 + 2?", "answer": 3}]
    before = _weights(tiny_model_dir)
    result = train(
        config, environments={"agent": AgentEnvironment(agent)}, dataset=dataset, backend=backend, console=False
    )
    [metrics] = result.history
    lines = (result.out / "trajectories" / "step-000001.jsonl").read_text().splitlines()
    trajectories = [Trajectory.from_json(json.loads(line)) for line in lines]
    after = _weights(result.out / "checkpoints" / "step-000001")
    assert not any(k.startswith("rollout/errors/") for k in metrics), metrics
    assert len(trajectories) == 2 and all(t.error is None for t in trajectories)
    assert all(token_fidelity_gap(t, renderer) is None for t in trajectories)
    assert metrics["reward/std"] > 0 and metrics["grad_norm"] > 0
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-3)  # the behaviour logprobs are the model's
    assert metrics["policy_tokens"] == sum(sum(s.loss_mask) for t in trajectories for s in t.segments)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step changed the policy
    return trajectories


@pytest.mark.slow  # CodeAgent's system prompt is ~5k tokens: the step takes ~20 s on CPU
def test_one_grpo_step_on_a_smolagents_code_agent(tiny_model_dir, tmp_path):
    from test_codeagent import ADD_CODE, code_agent, code_model

    def script(prompt, seed):  # a wrong answer on odd seeds
        reply = code_model(prompt)
        return reply if reply == ADD_CODE or seed % 2 == 0 else reply.replace("final_answer(3)", "final_answer(4)")

    agent = lambda base_url, row: code_agent(base_url, {**row, "stream": False})
    trajectories = one_grpo_step(tmp_path, tiny_model_dir, agent, script)
    for trajectory in trajectories:
        assert trajectory.turns == 2 and len(trajectory.segments) == 2
        assert trajectory.messages[3].content.startswith("Observation:\nExecution logs:\n3\n")  # add ran
    assert {t.total_reward for t in trajectories} == {0.0, 1.0}


def test_one_grpo_step_on_a_langgraph_react_agent(tiny_model_dir, tmp_path):
    from test_langgraph import langgraph_agent

    def script(prompt, seed):  # "The sum is 3." on even seeds, "The sum is 33." on odd ones
        reply = reply_for(prompt)
        return reply if reply == CALL_TEXT or seed % 2 == 0 else reply.replace("3", "33")

    agent = lambda base_url, row: langgraph_agent(base_url, {**row, "mode": "invoke", "responses": False})
    trajectories = one_grpo_step(tmp_path, tiny_model_dir, agent, script)
    for trajectory in trajectories:
        assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert trajectory.messages[2].content == CALL_TEXT and trajectory.messages[3].content == "3"
    assert {t.total_reward for t in trajectories} == {0.0, 1.0}


def test_one_grpo_step_on_openai_agents_over_the_responses_api(tiny_model_dir, tmp_path):
    from test_responses import agents_default_model_agent

    def script(prompt, seed):  # "The sum is 3." on even seeds, "The sum is 4." on odd ones
        reply = reply_for(prompt)
        return reply if reply == CALL_TEXT or seed % 2 == 0 else "The sum is 4."

    agent = lambda base_url, row: agents_default_model_agent(base_url, {**row, "id": 0})  # Runner.run
    trajectories = one_grpo_step(tmp_path, tiny_model_dir, agent, script)
    for trajectory in trajectories:
        assert [m.role for m in trajectory.messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert trajectory.messages[3].content == "3"  # the SDK ran the tool
    assert {t.total_reward for t in trajectories} == {0.0, 1.0}


def test_one_grpo_step_on_a_smolagents_tool_calling_agent(tiny_model_dir, tmp_path):
    from test_smolagents import ANSWER_CALL, OPENER, scripted_model, smolagents_agent

    def script(prompt, seed):  # continues the forced opener; answers 4 on odd seeds
        reply = scripted_model(prompt)
        wrong = ANSWER_CALL.removeprefix(OPENER).replace('"3"', '"4"')
        return wrong if seed % 2 and reply == ANSWER_CALL.removeprefix(OPENER) else reply

    trajectories = one_grpo_step(tmp_path, tiny_model_dir, smolagents_agent, script)
    for trajectory in trajectories:
        assert trajectory.turns == 2 and len(trajectory.segments) == 2
    assert {t.total_reward for t in trajectories} == {0.0, 1.0}


def _weights(directory):
    from safetensors.torch import load_file

    [file] = list(directory.glob("**/model.safetensors"))
    return load_file(file)
