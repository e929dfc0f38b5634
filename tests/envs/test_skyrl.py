"""SkyRL-Gym environments (the real ``skyrl-gym`` package) through rollforge's engine."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

pytest.importorskip("skyrl_gym")

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from rollforge import check_env, get_env_spec
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.adapters.skyrl_env import SkyRLEnvironment, gsm8k_rows
from rollforge.errors import ConfigError
from rollforge.inputs.config import EnvConfig
from rollforge.inputs.data import rows_to_samples
from rollforge.inputs.environments import build_environments, task_name
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import assert_replies_exact
from rollforge.types import Message, Sample


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def replay(renderer, replies):
    """A policy that answers turn k with ``replies[k]`` (counted from the prompt's user turns)."""

    def script(request):
        turns = renderer.decode(list(request.prompt_ids)).count("<|im_start|>assistant") - 1
        return replies[min(turns, len(replies) - 1)]

    return ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0])


async def test_gsm8k_multi_turn_keeps_per_turn_rewards_and_terminates(renderer):
    """The package's own gsm8k_multi_turn on a row in SkyRL's dataset shape: 0.2/5 for a formatted
    wrong answer, 0 for an unformatted one, 1.0 for the right one, which ends the episode."""
    row = gsm8k_rows("gsm8k_multi_turn", 1, seed=0)[0]  # Tom has 14 + 15 - 1 = 28 apples
    assert row["reward_spec"]["ground_truth"] == "28"
    samples = rows_to_samples([row], ["skyrl:gsm8k_multi_turn"])
    replies = ["14 + 15 = 29. #### 29", "Let me think again.", "14 + 15 - 1 = 28. #### 28"]
    env = get_env_spec("skyrl:gsm8k_multi_turn").build()
    result = await arollout(
        samples, {"skyrl:gsm8k_multi_turn": env}, replay(renderer, replies), renderer, RolloutConfig(max_turns=8)
    )
    t = result.trajectories[0]
    assert t.error is None, t.error
    assert t.rewards == pytest.approx((0.04, 0.0, 1.0))
    assert t.terminated and t.turns == 3 and not t.max_turns_reached
    # the environment's observations, as it wrote them, between the replies
    assert t.messages[2].role == "user" and "step-by-step reasoning" in t.messages[2].content
    assert t.messages[-1] == Message("assistant", replies[-1])
    assert_replies_exact(t, renderer, replies)


class Countdown(BaseTextEnv):
    """A user's BaseTextEnv: count down from extra_info's start; 0.5 per correct number, done at 0."""

    def __init__(self, env_config, extras):
        super().__init__()
        self.next = int(extras["extra_info"]["start"])
        self.scale = float(env_config.get("scale", 1.0))

    def init(self, prompt):
        return [*prompt, {"role": "user", "content": f"Start at {self.next}."}], {}

    def step(self, action):
        self.turns += 1
        right = action.strip() == str(self.next)
        self.next -= right
        done = self.next < 0 or self.turns >= 4
        obs = [] if done else [{"role": "user", "content": f"Next: {self.next}" if right else "Wrong."}]
        return BaseTextEnvStepOutput(
            observations=obs, reward=0.5 * self.scale * right, done=done, metadata={"next": self.next}
        )


@pytest.fixture
def countdown_id():
    skyrl_gym.register(id="rollforge_test_countdown", entry_point=Countdown)
    yield "rollforge_test_countdown"
    skyrl_gym.envs.registration.deregister("rollforge_test_countdown")


def countdown_sample(start: int, env_class: str | None = None) -> Sample:
    row = {"env_class": env_class, "extra_info": {"start": start}} if env_class else {"extra_info": {"start": start}}
    return Sample(prompt=(Message("user", "Count down."),), task_name="countdown", row=row)


async def test_a_user_registered_class_runs_unchanged(renderer, countdown_id):
    replies = ["1", "7", "0"]
    env = SkyRLEnvironment(countdown_id, env_config={"scale": 2.0})
    result = await arollout(
        [countdown_sample(1, countdown_id)],
        {"countdown": env},
        replay(renderer, replies),
        renderer,
        RolloutConfig(max_turns=8),
    )
    t = result.trajectories[0]
    assert t.error is None, t.error
    assert t.rewards == (1.0, 0.0, 1.0) and t.terminated and t.turns == 3
    assert t.messages[:2] == (Message("user", "Count down."), Message("user", "Start at 1."))
    assert [m.content for m in t.messages if m.role == "user"][2:] == ["Next: 0", "Wrong."]
    assert t.metadata == {"next": -1}
    assert_replies_exact(t, renderer, replies)
    assert str(check_env(env, samples=[countdown_sample(3)])).startswith("check_env(SkyRLEnvironment)")


async def test_an_entry_point_names_a_class_without_registering_it(renderer, tmp_path, monkeypatch):
    (tmp_path / "my_skyrl_envs.py").write_text(
        "from skyrl_gym.envs.base_text_env import BaseTextEnv\n"
        "class OneShot(BaseTextEnv):\n"
        "    def __init__(self, env_config=None, extras={}):\n"
        "        super().__init__()\n"
        "        self.answer = extras['reward_spec']['ground_truth']\n"
        "    def step(self, action):\n"
        "        return {'observations': [], 'reward': 0.5 * (action == self.answer), 'done': True, 'metadata': {},\n"
        "                'postprocessed_action': action + '!'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "skyrl:my_skyrl_envs:OneShot"
    config = EnvConfig(name=name)
    envs = build_environments([config])
    assert list(envs) == [name] == [task_name(config)]
    sample = Sample(prompt=(Message("user", "Say 0."),), task_name=name, row={"reward_spec": {"ground_truth": "0"}})
    result = await arollout([sample], envs, replay(renderer, ["0"]), renderer, RolloutConfig(max_turns=4))
    t = result.trajectories[0]
    assert t.rewards == (0.5,) and t.terminated
    # tokens stay as sampled; the rewrite SkyRL's generator would apply is kept in the metadata
    assert t.metadata == {"postprocessed_action": "0!"} and t.messages[-1] == Message("assistant", "0")
    assert_replies_exact(t, renderer, ["0"])


async def test_a_row_the_environment_refuses_fails_its_episode_in_one_line(renderer):
    env = get_env_spec("skyrl:gsm8k_multi_turn").build()
    bad = Sample(prompt=(Message("user", "What is 2 + 2?"),), task_name="g", row={"extra_info": {}})
    other = Sample(
        prompt=(Message("user", "What is 2 + 2?"),),
        task_name="g",
        row={"env_class": "gsm8k", "reward_spec": {"ground_truth": "4"}},
    )
    result = await arollout(
        [bad, other], {"g": env}, replay(renderer, ["#### 4"]), renderer, RolloutConfig(max_turns=2)
    )
    first, second = (t.error.message for t in result.trajectories)
    assert first.endswith(
        ": SkyRL-Gym environment 'gsm8k_multi_turn' refused the row: reward_spec.ground_truth is required"
    )
    assert second.endswith(
        "row's env_class 'gsm8k' is not this environment's ('gsm8k_multi_turn'); route rows to "
        "environments with a task_name column"
    )


def test_bad_names_are_one_clear_line():
    with pytest.raises(ConfigError, match="unknown SkyRL-Gym environment 'gsm8k_multi'; close names: gsm8k_multi_turn"):
        get_env_spec("skyrl:gsm8k_multi")
    with pytest.raises(ConfigError, match="entry point 'no_such_module_xyz:Env' does not load"):
        get_env_spec("skyrl:no_such_module_xyz:Env")
    with pytest.raises(ConfigError, match="expected a BaseTextEnv subclass"):
        get_env_spec("skyrl:json:dumps")
    with pytest.raises(ConfigError, match="skyrl:search has no prompt generator; give prompts with --data"):
        get_env_spec("skyrl:search").samples(2, 0)


def test_check_env_passes_on_the_shipped_gsm8k_environments():
    for name in ("skyrl:gsm8k", "skyrl:gsm8k_multi_turn"):
        assert check_env(name).samples == 3


def test_generated_rows_have_skyrl_dataset_shape_and_survive_jsonl():
    rows = gsm8k_rows("gsm8k", 2, seed=1)
    assert rows == json.loads(json.dumps(rows))
    assert set(rows[0]) == {"data_source", "prompt", "env_class", "reward_spec", "extra_info"}
    assert rows[0]["prompt"][0]["content"].endswith('output the final answer after "####".')


def test_the_cli_rolls_out_skyrl_rows_from_a_data_file(tiny_model_dir, tmp_path):
    """``rollforge rollout --env skyrl:gsm8k_multi_turn --data rows.jsonl`` with SkyRL's row shape
    (the tiny random model answers nonsense: no reward, two turns each)."""
    from rollforge.cli.main import main

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in gsm8k_rows("gsm8k_multi_turn", 2, seed=0)))
    out = tmp_path / "run"
    assert (
        main(
            [
                "rollout",
                "--model",
                str(tiny_model_dir),
                "--env",
                "skyrl:gsm8k_multi_turn",
                "--data",
                str(data),
                "--max-turns",
                "2",
                "--max-new-tokens",
                "4",
                "--concurrency",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [(r["task_name"], r["turns"], r["error"]) for r in records] == [("skyrl:gsm8k_multi_turn", 2, None)] * 2
