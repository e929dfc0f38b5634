"""mini-swe-agent 2.4 through ``AgentEnvironment``: its own ``DefaultAgent`` and text-based litellm
model (the package's ``mini_textbased.yaml`` config) against the gateway, its shell commands in
rollforge's sandbox (``SandboxShell``), the reward taken from its own submission."""

import os
from pathlib import Path

import pytest
import yaml

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import token_fidelity_gap
from rollforge.envs.sandbox import sandbox_support
from rollforge.gateway import AgentEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at litellm's import
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
minisweagent = pytest.importorskip("minisweagent")  # the `agents` extra (scripts/install.sh installs it)
from minisweagent.agents.default import DefaultAgent  # noqa: E402

from rollforge.gateway.mini_swe_agent import SandboxShell, gateway_model  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow,
              pytest.mark.skipif(sandbox_support() is not None, reason=f"no sandbox here: {sandbox_support()}")]

ANSWER = "hello from the sandbox"
CONFIG = yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "mini_textbased.yaml").read_text())


def command(text: str) -> str:
    return f"THOUGHT: one step.\n\n```mswea_bash_command\n{text}\n```"


def replies(host_file: Path) -> list[str]:
    """Write a file in the workspace, try to write one on the host, then submit the file's content."""
    return [command(f"printf '{ANSWER}\\n' > hello.txt && pwd"),
            command(f"echo escaped > {host_file}"),
            command("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat hello.txt")]


def scripted(renderer, host_file: Path, generated: list):
    """A backend replying with step n after n observations (mini-swe-agent's ``<returncode>``),
    recording the ids it generated."""
    script = replies(host_file)

    class Recording(ScriptedBackend):
        async def generate(self, prompt_ids, params):
            completion = await super().generate(prompt_ids, params)
            generated.append(list(completion.token_ids))
            return completion

    return Recording(lambda request: script[renderer.decode(request.prompt_ids).count("<returncode>")], renderer.tokenizer)


def mini_swe_agent(base_url, row):
    model = gateway_model(base_url, **CONFIG["model"])
    agent = DefaultAgent(model, SandboxShell(**CONFIG["environment"], timeout=10), **{**CONFIG["agent"], "step_limit": 5})
    result = agent.run(row["prompt"][-1]["content"])
    return 1.0 if result["exit_status"] == "Submitted" and result["submission"].strip() == row["answer"] else 0.0


async def test_mini_swe_agent_runs_its_commands_in_the_sandbox(tokenizer, renderer, tmp_path):
    host_file, generated = tmp_path / "escaped.txt", []
    backend = scripted(renderer, host_file, generated)
    sample = Sample([{"role": "user", "content": f"Write '{ANSWER}' to hello.txt and submit it."}], "swe", {"answer": ANSWER})
    config = RolloutConfig(max_seq_len=8192, max_new_tokens=256, max_turns=5)
    result = await arollout([sample], {"swe": AgentEnvironment(mini_swe_agent)}, backend, renderer, config)
    [trajectory] = result.trajectories

    assert trajectory.error is None and trajectory.total_reward == 1.0, trajectory.error
    assert trajectory.turns == 3 and len(generated) == 3
    observations = [m.content for m in trajectory.messages if m.role == "user"][1:]
    assert "<returncode>0</returncode>" in observations[0] and "/sandbox" in observations[0]
    assert "<returncode>1</returncode>" in observations[1]  # the host path is not there to write to
    assert not host_file.exists() and not Path("hello.txt").exists() and not Path("/sandbox/hello.txt").exists()
    assert token_fidelity_gap(trajectory, renderer) is None
    masked = [t for segment in trajectory.segments for t, bit in zip(segment.token_ids, segment.loss_mask) if bit]
    assert masked == [t for ids in generated for t in ids]  # the loss covers exactly what the policy generated
