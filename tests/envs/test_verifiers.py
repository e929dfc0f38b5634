"""verifiers 0.4 tasksets run unchanged in their own venv (``verifiers:<taskset>``): a scripted
policy answers through the gateway, the trajectory is token-exact and verifiers' own reward is the
episode's reward; a failing taskset fails only its episodes. Skipped when the venv is absent
(``scripts/install.sh`` makes it)."""

from __future__ import annotations

import re
import textwrap

import pytest

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.envs.adapters import verifiers_env
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout

pytestmark = pytest.mark.timeout(600)

_NO_VENV = pytest.mark.skipif(
    not (verifiers_env.venv_dir() / "bin" / "python").is_file(),
    reason=f"no verifiers venv at {verifiers_env.venv_dir()} (bash scripts/install.sh makes it)",
)


def needs_venv(test):
    """Runs verifiers in its venv (seconds per worker start): slow, and skipped without the venv."""
    return pytest.mark.slow(_NO_VENV(test))


ADDITION = """
import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: str


class AdditionTask(vf.Task[AdditionData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return 1.0 if trace.last_reply.strip() == task.answer else 0.0


class AdditionTaskset(vf.Taskset[AdditionTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(1, 2), (3, 4)]:
            yield AdditionTask(AdditionData(prompt=f"What is {a} + {b}?", answer=str(a + b)), self.config.task)


__all__ = ["AdditionTaskset"]
"""


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def scripted(renderer, reply):
    return ScriptedBackend(lambda request: reply(renderer.decode(request.prompt_ids)), renderer.tokenizer)


def write(tmp_path, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


@needs_venv
async def test_a_taskset_runs_unchanged_with_its_own_reward(renderer, tmp_path):
    spec = get_env_spec("verifiers:" + write(tmp_path, "vf_addition", ADDITION))
    samples = spec.samples(2, 0)
    assert [s.prompt[-1].content for s in samples] == ["What is 1 + 2?", "What is 3 + 4?"]
    backend = scripted(renderer, lambda prompt: "3" if "1 + 2" in prompt else "8")  # right, then wrong
    result = await arollout(samples, {samples[0].task_name: spec.build()}, backend, renderer, RolloutConfig())
    right, wrong = result.trajectories
    assert right.error is None and wrong.error is None, (right.error, wrong.error)
    assert (right.total_reward, wrong.total_reward) == (1.0, 0.0)
    for trajectory, answer in ((right, "3"), (wrong, "8")):
        assert token_fidelity_gap(trajectory, renderer) is None
        generated = [t for t, bit in zip(trajectory.token_ids, trajectory.loss_mask) if bit]
        assert generated == renderer.encode(answer) + [renderer.stop_token_ids[0]]


TOOLS = '''
import verifiers.v1 as vf


class Calculator(vf.Toolset[vf.ToolsetConfig, vf.State]):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task, trace) -> float:
        return 1.0 if task.answer in trace.last_reply else 0.0


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        yield SumTask(SumData(prompt="What is 1 + 2? Use the add tool.", answer="3"), self.config.task)


__all__ = ["SumTaskset"]

if __name__ == "__main__":
    Calculator.run()
'''


def tool_reply(prompt: str) -> str:
    """Calls the offered add tool once, then answers with its result."""
    last = prompt.rsplit("<|im_start|>", 2)[-2]
    if last.startswith("tool\n") or "<tool_response>" in last:
        return "The sum is " + re.findall(r"\d+", last)[-1] + "."
    name = re.search(r"^- (\w*add):", prompt, re.M).group(1)  # verifiers prefixes the toolset's name
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"a": 1, "b": 2}}}}\n</tool_call>'


@needs_venv
async def test_a_tool_taskset_makes_a_tool_round_trip(renderer, tmp_path):
    spec = get_env_spec("verifiers:" + write(tmp_path, "vf_tools", TOOLS))
    samples = spec.samples(1, 0)
    result = await arollout(
        samples, {samples[0].task_name: spec.build()}, scripted(renderer, tool_reply), renderer, RolloutConfig()
    )
    [trajectory] = result.trajectories
    assert trajectory.error is None, trajectory.error
    assert [m.role for m in trajectory.messages][-3:] == ["assistant", "tool", "assistant"]
    assert trajectory.messages[-2].content.strip() == "3" and trajectory.messages[-1].content == "The sum is 3."
    assert trajectory.total_reward == 1.0 and token_fidelity_gap(trajectory, renderer) is None


CRASHING = ADDITION.replace("return 1.0 if", "assert task.answer != '7', 'the grader fell over'\n        return 1.0 if")


@needs_venv
async def test_a_crashing_taskset_fails_only_its_episode_with_one_line(renderer, tmp_path):
    spec = get_env_spec("verifiers:" + write(tmp_path, "vf_crashing", CRASHING))
    samples = spec.samples(2, 0)
    result = await arollout(
        samples, {samples[0].task_name: spec.build()}, scripted(renderer, lambda prompt: "3"), renderer, RolloutConfig()
    )
    ok, crashed = result.trajectories
    assert ok.error is None and ok.total_reward == 1.0
    assert crashed.error.kind == "env_error" and crashed.turns == 1  # what it generated is kept
    reason = crashed.error.message.split("stderr: ")[-1]
    assert (
        reason
        == "the verifiers episode failed: TaskError: task AdditionTask scoring: AssertionError: the grader fell over"
    ), reason


def test_a_missing_venv_is_one_line_saying_how_to_make_it(monkeypatch, tmp_path):
    monkeypatch.setenv(verifiers_env.VENV_VARIABLE, str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError) as caught:
        get_env_spec("verifiers:my_taskset_that_is_not_cached")
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "nowhere") in message and "bash scripts/install.sh" in message


@needs_venv
def test_a_row_without_its_task_position_is_refused(tmp_path):
    import subprocess

    path = write(tmp_path, "vf_addition", ADDITION)
    done = subprocess.run(
        verifiers_env.command(path), input='{"prompt": []}', capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1 and done.stderr.strip().endswith(
        "needs vf_task (the task's position in the taskset), got None"
    )


GUESSING = '''
import verifiers.v1 as vf


class GuessData(vf.TaskData):
    answer: str


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    pass


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        yield GuessTask(GuessData(prompt="Guess my number from 1 to 3. Reply with the number only.", answer="2"),
                        self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The env plays the user: 'Too low.' until the right guess or three guesses."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment, guesses = await interaction.turn(), 1
            while not segment.terminated and segment.last_reply.strip() != task.data.answer and guesses < 3:
                segment, guesses = await interaction.turn("Too low."), guesses + 1
        solved = not segment.terminated and segment.last_reply.strip() == task.data.answer
        interaction.trace.record_reward("solved", 1.0 if solved else 0.0, 1.0)
        interaction.trace.record_reward("fast", 1.0 / guesses, 0.5)


__all__ = ["GuessTaskset", "GuessEnv"]
'''


@needs_venv
async def test_a_multi_turn_env_plays_the_user(renderer, tmp_path):
    spec = get_env_spec("verifiers:" + write(tmp_path, "vf_guessing", GUESSING))
    samples = spec.samples(1, 0)
    backend = scripted(renderer, lambda prompt: "2" if "Too low." in prompt else "1")
    result = await arollout(samples, {samples[0].task_name: spec.build()}, backend, renderer, RolloutConfig())
    [trajectory] = result.trajectories
    assert trajectory.error is None, trajectory.error
    assert [(m.role, m.content) for m in trajectory.messages[-4:]] == [
        ("user", samples[0].prompt[-1].content),
        ("assistant", "1"),
        ("user", "Too low."),
        ("assistant", "2"),
    ]
    assert trajectory.total_reward == 1.0 + 0.5 * 0.5  # solved, weight 1; fast (1/2 guesses), weight 0.5
    assert token_fidelity_gap(trajectory, renderer) is None


@needs_venv
def test_a_taskset_id_is_imported_from_the_working_directory_and_its_tasks_wrap(monkeypatch, tmp_path):
    write(tmp_path, "vf_addition_by_id", ADDITION)
    monkeypatch.chdir(tmp_path)
    samples = get_env_spec("verifiers:vf_addition_by_id").samples(3, 1)  # from position 1 on, around the two tasks
    assert [(s.row["vf_task"], s.prompt[-1].content) for s in samples] == [
        (1, "What is 3 + 4?"),
        (0, "What is 1 + 2?"),
        (1, "What is 3 + 4?"),
    ]
    assert {s.task_name for s in samples} == {"verifiers:vf_addition_by_id"}


CODE_HARNESS = ADDITION.replace(
    '__all__ = ["AdditionTaskset"]',
    """
from verifiers.v1.harnesses.null import NullHarness


class CodeHarness(NullHarness):
    EXECUTES_CODE = True  # as bash, codex, mini_swe_agent, ...


__all__ = ["AdditionTaskset", "CodeHarness"]""",
)


@needs_venv
def test_a_harness_that_runs_the_models_code_needs_consent(monkeypatch, tmp_path):
    name = "verifiers:" + write(tmp_path, "vf_code_harness", CODE_HARNESS)
    with pytest.raises(
        ConfigError,
        match="'vf_code_harness' .seat 'agent'. runs the model's code, and rollforge runs "
        "verifiers harnesses on this machine; set ROLLFORGE_VERIFIERS_HOST_CODE=1",
    ):
        get_env_spec(name).samples(1, 0)
    monkeypatch.setenv("ROLLFORGE_VERIFIERS_HOST_CODE", "1")
    assert [s.row["vf_task"] for s in get_env_spec(name).samples(1, 0)] == [0]


@needs_venv
async def test_the_envs_own_seat_settings_are_kept(renderer, tmp_path):
    one_turn = GUESSING.replace(
        "player: vf.AgentConfig = vf.AgentConfig()", "player: vf.AgentConfig = vf.AgentConfig(max_turns=1)"
    )
    spec = get_env_spec("verifiers:" + write(tmp_path, "vf_guessing_once", one_turn))
    samples = spec.samples(1, 0)
    backend = scripted(renderer, lambda prompt: "2" if "Too low." in prompt else "1")
    result = await arollout(samples, {samples[0].task_name: spec.build()}, backend, renderer, RolloutConfig())
    [trajectory] = result.trajectories
    assert trajectory.error is None and trajectory.turns == 1, trajectory.error
    assert trajectory.total_reward < 1.0  # stopped after the wrong first guess


def test_the_venv_lives_beside_the_one_rollforge_runs_in(monkeypatch, tmp_path):
    """Not inside the source checkout: a regular install and a notebook find the same venv."""
    import sys

    monkeypatch.delenv(verifiers_env.VENV_VARIABLE, raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "env"))
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert verifiers_env.venv_dir() == tmp_path / "env" / "venvs" / "verifiers"
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "env"))  # no virtual environment
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert verifiers_env.venv_dir() == tmp_path / "data" / "rollforge" / "venvs" / "verifiers"
    monkeypatch.setenv(verifiers_env.VENV_VARIABLE, str(tmp_path / "mine"))
    assert verifiers_env.venv_dir() == tmp_path / "mine"
