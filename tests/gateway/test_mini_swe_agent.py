"""mini-swe-agent 2.4 through ``AgentEnvironment``: its own ``DefaultAgent`` and text-based litellm
model (the package's ``mini_textbased.yaml`` config) against the gateway, its shell commands in
rollforge's sandbox (``SandboxShell``), the reward taken from its own submission."""

import os
from pathlib import Path

import pytest
import torch
import yaml

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import token_fidelity_gap
from rollforge.envs.sandbox import SandboxLimits, sandbox_support
from rollforge.errors import ConfigError
from rollforge.gateway import AgentEnvironment
from rollforge.models import load_model
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.train.advantages import compute_advantages
from rollforge.train.losses import ClippedPolicyLoss, TokenMean
from rollforge.train.update import TrainedPolicy, UpdateSettings, policy_update, sequences
from rollforge.types import Sample

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at litellm's import
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
minisweagent = pytest.importorskip("minisweagent")  # the `agents` extra (scripts/install.sh installs it)
from minisweagent.agents.default import DefaultAgent
from minisweagent.exceptions import Submitted

from rollforge.gateway.mini_swe_agent import SandboxShell, gateway_model

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(sandbox_support() is not None, reason=f"no sandbox here: {sandbox_support()}"),
]

ANSWER = "hello from the sandbox"
CONFIG = yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "mini_textbased.yaml").read_text())


def command(text: str) -> str:
    return f"THOUGHT: one step.\n\n```mswea_bash_command\n{text}\n```"


def replies(host_file: Path) -> list[str]:
    """Write a file in the workspace, try to write one on the host, then submit the file's content."""
    return [
        command(f"printf '{ANSWER}\\n' > hello.txt && pwd"),
        command(f"echo escaped > {host_file}"),
        command("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat hello.txt"),
    ]


def scripted(renderer, host_file: Path, generated: list):
    """A backend replying with step n after n observations (mini-swe-agent's ``<returncode>``),
    recording the ids it generated."""
    script = replies(host_file)

    class Recording(ScriptedBackend):
        async def generate(self, prompt_ids, params):
            completion = await super().generate(prompt_ids, params)
            generated.append(list(completion.token_ids))
            return completion

    return Recording(
        lambda request: script[renderer.decode(request.prompt_ids).count("<returncode>")], renderer.tokenizer
    )


def mini_swe_agent(base_url, row):
    model = gateway_model(base_url, **CONFIG["model"])
    agent = DefaultAgent(
        model, SandboxShell(**CONFIG["environment"], timeout=10), **{**CONFIG["agent"], "step_limit": 5}
    )
    result = agent.run(row["prompt"][-1]["content"])
    return 1.0 if result["exit_status"] == "Submitted" and result["submission"].strip() == row["answer"] else 0.0


@pytest.mark.slow  # litellm's import alone takes seconds
async def test_mini_swe_agent_runs_its_commands_in_the_sandbox(tokenizer, renderer, tmp_path):
    host_file, generated = tmp_path / "escaped.txt", []
    backend = scripted(renderer, host_file, generated)
    sample = Sample(
        [{"role": "user", "content": f"Write '{ANSWER}' to hello.txt and submit it."}], "swe", {"answer": ANSWER}
    )
    config = RolloutConfig(max_seq_len=8192, max_new_tokens=256, max_turns=5)
    result = await arollout([sample], {"swe": AgentEnvironment(mini_swe_agent)}, backend, renderer, config)
    [trajectory] = result.trajectories

    assert trajectory.error is None and trajectory.total_reward == 1.0, trajectory.error
    assert (
        trajectory.turns == 3 and len(generated) == 3 and len(trajectory.segments) == 1
    )  # its history is sent back verbatim
    observations = [m.content for m in trajectory.messages if m.role == "user"][1:]
    assert "<returncode>0</returncode>" in observations[0] and "/sandbox" in observations[0]
    assert "<returncode>1</returncode>" in observations[1]  # the host path is not there to write to
    assert not host_file.exists() and not Path("hello.txt").exists() and not Path("/sandbox/hello.txt").exists()
    assert token_fidelity_gap(trajectory, renderer) is None
    masked = [t for segment in trajectory.segments for t, bit in zip(segment.token_ids, segment.loss_mask) if bit]
    assert masked == [t for ids in generated for t in ids]  # the loss covers exactly what the policy generated


# -- SandboxShell alone: mini-swe-agent's environment contract ---------------------------------------


def run(shell: SandboxShell, text: str, cwd: str = "") -> dict:
    return shell.execute({"command": text}, cwd)


def test_the_workspace_persists_between_commands_with_modes_and_folders():
    shell = SandboxShell(files={"src/a.py": "x = 1\n"}, timeout=5)
    first = run(
        shell, "cat src/a.py && printf '#!/bin/sh\\necho ran\\n' > run.sh && chmod +x run.sh && echo 2 > src/b.txt"
    )
    assert first == {"output": "x = 1\n", "returncode": 0, "exception_info": ""}
    second = run(shell, "../run.sh && cat b.txt && pwd && echo oops >&2; exit 3", cwd="/sandbox/src")
    assert second == {"output": "ran\n2\n/sandbox/src\noops\n", "returncode": 3, "exception_info": ""}  # stderr merged


def test_a_command_past_its_timeout_is_stopped_and_its_changes_kept():
    shell = SandboxShell(timeout=1)
    slow = run(shell, "echo before > kept.txt && echo partial && sleep 20")
    assert slow["returncode"] == -1 and slow["output"] == "partial\n"
    assert "timed out after 1 seconds" in slow["exception_info"]
    assert run(shell, "cat kept.txt")["output"] == "before\n"


def test_a_command_over_the_output_cap_is_killed_and_its_changes_lost():
    shell = SandboxShell(timeout=5, limits=SandboxLimits(output_bytes=1024))
    loud = run(shell, "echo x > lost.txt && head -c 100000 /dev/zero | tr '\\0' a")
    assert loud["returncode"] == -1 and "output limit exceeded" in loud["exception_info"]
    assert run(shell, "ls")["output"] == ""


def test_a_workspace_too_large_to_keep_is_reported_and_the_previous_one_kept():
    shell = SandboxShell(timeout=5, files={"small.txt": "small\n"})
    big = run(shell, "head -c 2000000 /dev/urandom > big.bin && echo made")
    assert big["returncode"] == 0 and big["output"] == "made\n" and "over the 921600 kept" in big["exception_info"]
    assert run(shell, "ls")["output"] == "small.txt\n"


def test_the_submit_line_ends_the_run_with_the_rest_of_the_output_as_submission():
    shell = SandboxShell(timeout=5)
    assert run(shell, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false")["returncode"] == 1  # failed: no submission
    with pytest.raises(Submitted) as submitted:
        run(shell, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo the answer")
    assert submitted.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "the answer\n"}


def test_bad_values_are_named():
    with pytest.raises(ConfigError, match="timeout must be a positive number of seconds, got 0"):
        SandboxShell(timeout=0)
    with pytest.raises(ConfigError, match="may not use the name '.rollforge-workspace.tgz.b64'"):
        SandboxShell(files={".rollforge-workspace.tgz.b64": ""})


@pytest.mark.slow
async def test_one_grpo_step_on_mini_swe_agent_trajectories(tiny_model_dir, tokenizer, renderer):
    """Four runs of one task, two submitting the file and two a wrong answer: mini-swe-agent's own
    submissions are the rewards, and one GRPO update of the tiny model on the trajectories moves it."""
    write = command(f"printf '{ANSWER}\\n' > hello.txt")
    submit = {
        True: command("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat hello.txt"),
        False: command("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo wrong"),
    }

    def script(request):
        prompt = renderer.decode(request.prompt_ids)
        return submit["(right)" in prompt] if "<returncode>" in prompt else write

    samples = [
        Sample(
            [{"role": "user", "content": f"Write '{ANSWER}' to hello.txt and submit it ({kind})."}],
            "swe",
            {"answer": ANSWER},
        )
        for kind in ("right", "wrong", "right", "wrong")
    ]
    config = RolloutConfig(max_seq_len=8192, max_new_tokens=256, max_turns=4)
    result = await arollout(
        samples, {"swe": AgentEnvironment(mini_swe_agent)}, ScriptedBackend(script, tokenizer), renderer, config
    )
    rewards = [t.total_reward for t in result.trajectories]
    assert rewards == [1.0, 0.0, 1.0, 0.0] and all(t.error is None and t.turns == 2 for t in result.trajectories)

    model, _ = load_model(tiny_model_dir)
    model.requires_grad_(True)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    episodes, owners = sequences(result.trajectories)
    advantages = compute_advantages(rewards, group_size=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = policy_update(
        TrainedPolicy(model, optimizer),
        episodes,
        advantages.values[owners],
        TokenMean().weights([e.mask for e in episodes]),
        ClippedPolicyLoss(),
        UpdateSettings(micro_batch_tokens=32_768, pad_id=tokenizer.pad_token_id or 0),
    )
    assert stats.policy_tokens == sum(sum(t.loss_mask) for t in result.trajectories) and stats.grad_norm > 0
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())
