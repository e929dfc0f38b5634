"""The bundled environments: registry, samples, and each game's rules and rewards."""

from __future__ import annotations

import asyncio
import pickle
import re
import subprocess
import sys

import pytest

from rollforge.envs.base import Environment, Step
from rollforge.envs.library import ENV_NAMES, EnvSpec, get_env_spec
from rollforge.envs.library import arithmetic, guess_number, wordle
from rollforge.envs.library.catch import CatchEnv
from rollforge.envs.library.echo import EchoEnv
from rollforge.envs.library.wordle import WordleEnv, score_guess
from rollforge.envs.library.words import WORDS
from rollforge.envs.sandbox import SandboxUnavailable
from rollforge.errors import ConfigError, MissingDependency
from rollforge.types import Message, Sample, ToolCall

# -- registry ----------------------------------------------------------------------------------


def test_registry_names_and_specs():
    assert ENV_NAMES == (
        "echo",
        "arithmetic",
        "calculator",
        "catch",
        "wordle",
        "guess_number",
        "python_code",
        "shapes",
        "math",
        "frozenlake",
        "reasoning_gym:basic_arithmetic",
        "reasoning_gym:leg_counting",
        "textarena:GuessTheNumber-v0",
        "textarena:Mastermind-v0",
        "textarena:Sudoku-v0-very-easy",
        "gymnasium:CliffWalking-v1",
    )


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_spec_builds_an_environment(name):
    spec = spec_or_skip(name)
    assert isinstance(spec, EnvSpec) and spec.name == name and spec.description
    assert isinstance(build_or_skip(spec), Environment)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_bundled_environment_crosses_to_a_worker_process(name):
    """Engine workers and Ray actors receive environments pickled (classes by reference)."""
    environment = build_or_skip(spec_or_skip(name))
    assert type(pickle.loads(pickle.dumps(environment))) is type(environment)


def spec_or_skip(name: str) -> EnvSpec:
    """The spec, or a skip naming the optional dependency that is not installed."""
    try:
        return get_env_spec(name)
    except MissingDependency as exc:
        pytest.skip(str(exc))


def build_or_skip(spec: EnvSpec) -> Environment:
    try:
        return spec.build()
    except (MissingDependency, SandboxUnavailable) as exc:
        pytest.skip(str(exc))


def test_family_members_are_built_on_demand_and_cached():
    spec = spec_or_skip("reasoning_gym:chain_sum")  # not listed, still available
    assert spec.name == "reasoning_gym:chain_sum" and "chain_sum" in spec.description
    assert get_env_spec("reasoning_gym:chain_sum") is spec
    assert {s.task_name for s in spec.samples(2, 0)} == {"reasoning_gym:chain_sum"}


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown environment 'chess'") as info:
        get_env_spec("chess")
    for name in ENV_NAMES:
        assert name in str(info.value)
    assert "families: reasoning_gym:<name>, textarena:<name>, gymnasium:<name>" in str(info.value)
    for bad in ("reasoning_gym:", ":catch", None):
        with pytest.raises(ConfigError, match="unknown environment"):
            get_env_spec(bad)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_samples_are_deterministic_and_routed(name):
    spec = spec_or_skip(name)
    samples = spec.samples(6, 11)
    assert len(samples) == 6
    assert samples == spec.samples(6, 11)
    assert samples[:3] == spec.samples(3, 11)
    assert samples != spec.samples(6, 12)
    for s in samples:
        assert isinstance(s, Sample) and s.task_name == name
        assert s.prompt[-1].role == "user" and s.prompt[-1].content


def test_importing_the_library_does_not_import_torch():
    code = "import sys, rollforge.envs.library, rollforge.envs.check; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_word_list():
    assert len(WORDS) >= 200
    assert len(set(WORDS)) == len(WORDS) and list(WORDS) == sorted(WORDS)
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in WORDS)


# -- helpers to play through the EnvSession contract -------------------------------------------


def call(name: str, **arguments) -> Message:
    return Message("assistant", f"<tool_call>{name}</tool_call>", tool_calls=(ToolCall(name, arguments),))


async def play(env: Environment, sample: Sample, policy) -> tuple[list[Step], float]:
    """Play an episode: ``policy(last_text)`` returns the next assistant message."""
    session = env.open(sample)
    conversation = list((await session.reset(sample)).prompt)
    steps: list[Step] = []
    try:
        for _ in range(20):
            last = conversation[-1].content
            conversation.append(policy(last))
            step = await session.step(tuple(conversation))
            steps.append(step)
            conversation.extend(step.messages)
            if step.terminated:
                break
        return steps, await session.finish()
    finally:
        await session.close()


# -- echo --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "reward"), [("{word}", 1.0), (" {Word} ", 1.0), ("{word}s", 0.0), ("pear", 0.0)])
async def test_echo_rewards_the_requested_word(text, reward):
    sample = get_env_spec("echo").samples(1, 0)[0]
    word = sample.row["word"]
    assert f'"{word}"' in sample.prompt[-1].content
    text = text.format(word=word, Word=word.title())
    steps, final = await play(get_env_spec("echo").build(), sample, lambda _: call("echo", text=text))
    assert steps[0].messages[0].role == "tool" and steps[0].terminated  # one attempt
    assert final == reward


async def test_echo_without_a_tool_call_scores_zero():
    sample = get_env_spec("echo").samples(1, 0)[0]
    answer = Message("assistant", sample.row["word"])
    steps, final = await play(get_env_spec("echo").build(), sample, lambda _: answer)
    assert steps[-1].terminated and final == 0.0


async def test_echo_tool_schema():
    sample = get_env_spec("echo").samples(1, 0)[0]
    reset = await get_env_spec("echo").build().open(sample).reset(sample)
    assert [t["function"]["name"] for t in reset.tools] == ["echo"]
    assert reset.tools[0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The text to repeat."}},
        "required": ["text"],
    }


def test_echo_class_directly():
    env = EchoEnv()
    assert env.reset(word="tiger") is None
    assert env.get_reward() == 0.0
    assert env.echo("tiger") == "tiger" and env.done and env.get_reward() == 1.0


# -- arithmetic --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        ("7", 1.0),
        ("The answer is 7.", 1.0),
        ("3 + 4 = 7", 1.0),
        ("7.0", 1.0),
        ("It is 7, not 8", 0.0),  # the last number counts
        ("8", 0.0),
        ("-7", 0.0),
        ("I don't know.", 0.0),
        ("", 0.0),
    ],
)
def test_arithmetic_score(answer, reward):
    assert arithmetic.score_answer(answer, 7) == reward


def test_last_number():
    assert arithmetic.last_number("1,024 apples") == 1024.0
    assert arithmetic.last_number("from 3-4 to 12") == 12.0
    assert arithmetic.last_number("5-3") == 3.0  # a hyphen between digits is not a minus sign
    assert arithmetic.last_number("none") is None


async def test_arithmetic_episode_batch():
    spec = get_env_spec("arithmetic")
    samples = spec.samples(3, 0)
    answers = [s.row["metadata"]["answer"] for s in samples]
    a, b = samples[0].row["metadata"]["a"], samples[0].row["metadata"]["b"]
    assert samples[0].prompt == (Message("user", f"What is {a} + {b}? Answer with just the number."),)
    env = spec.build()
    sessions = [env.open(s) for s in samples]
    for session, s in zip(sessions, samples):
        await session.reset(s)
    replies = [str(answers[0]), f"It is {answers[1] + 1}.", "no idea"]
    steps = await asyncio.gather(
        *(sess.step((*s.prompt, Message("assistant", r))) for sess, s, r in zip(sessions, samples, replies))
    )
    assert [st.reward for st in steps] == [1.0, 0.0, 0.0]
    assert all(st.terminated and st.messages == () for st in steps)
    assert sessions[1].metadata["answer"] == answers[1]


def test_arithmetic_digits():
    one = arithmetic.samples(50, 0)
    assert all(0 <= s.row["metadata"][k] <= 9 for s in one for k in "ab")
    two = arithmetic.samples(50, 0, digits=2)
    assert all(10 <= s.row["metadata"][k] <= 99 for s in two for k in "ab")
    assert all(s.row["metadata"]["answer"] == s.row["metadata"]["a"] + s.row["metadata"]["b"] for s in two)
    with pytest.raises(ConfigError, match="digits"):
        arithmetic.samples(1, 0, digits=0)


# -- catch -------------------------------------------------------------------------------------

_POSITIONS = re.compile(r"Ball: column (\d), row \d of 5\. Paddle: column (\d)\.")


def chase(text: str) -> str:
    ball, paddle = map(int, _POSITIONS.search(text).groups())
    return "left" if paddle > ball else "right" if paddle < ball else "stay"


def flee(text: str) -> str:
    ball, paddle = map(int, _POSITIONS.search(text).groups())
    if paddle == ball:
        return "left" if paddle > 1 else "right"
    return "right" if paddle > ball else "left"


@pytest.mark.parametrize("seed", range(40))
def test_catch_optimal_policy_always_catches_and_fleeing_always_misses(seed):
    for policy, reward in ((chase, 1.0), (flee, 0.0)):
        env = CatchEnv()
        text = env.reset(seed=seed)
        moves = 0
        while not env.done:
            text = env.move(policy(text))
            moves += 1
        assert moves == 4
        assert env.get_reward() == reward
        assert ("you caught it!" in text) == (reward == 1.0)


def test_catch_board_text():
    env = CatchEnv()
    text = env.reset(seed=3)
    assert text == env.reset(seed=3)  # deterministic given the row
    assert "Rules:" in text and "left, right or stay" in text
    ball, paddle = map(int, _POSITIONS.search(text).groups())
    grid = [line.split() for line in text.splitlines() if re.fullmatch(r"([.oP] ){4}[.oP]", line)]
    assert len(grid) == 5
    assert grid[0][ball - 1] == "o" and grid[4][paddle - 1] == "P"
    assert sum(row.count("o") for row in grid) == 1


def test_catch_walls_and_game_over():
    env = CatchEnv()
    env.reset(seed=0)
    env._paddle_col = 0  # noqa: SLF001 - pin the paddle to the left wall
    text = env.move("left")
    assert "Paddle: column 1." in text
    for _ in range(3):
        env.move("stay")
    assert env.done
    assert env.move("right") == "The game is over."


async def test_catch_through_the_factory():
    spec = get_env_spec("catch")
    sample = spec.samples(1, 5)[0]
    reset = await spec.build().open(sample).reset(sample)
    schema = reset.tools[0]["function"]
    assert schema["name"] == "move"
    assert schema["parameters"]["properties"]["direction"]["enum"] == ["left", "right", "stay"]

    steps, final = await play(spec.build(), sample, lambda text: call("move", direction=chase(text)))
    assert len(steps) == 4 and steps[-1].terminated and final == 1.0
    assert [st.messages[0].role for st in steps] == ["tool"] * 4

    steps, final = await play(spec.build(), sample, lambda text: call("move", direction="up"))
    # An invalid direction is a counted failure, not a move; the episode goes on.
    assert steps[0].failures[0].kind == "tool_bad_arguments" and not steps[0].terminated


# -- wordle ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("guess", "target", "marks"),
    [
        ("crane", "crane", "GGGGG"),
        ("crane", "jelly", "____Y"),
        ("apple", "jelly", "___GY"),
        ("speed", "abide", "__Y_Y"),  # one e in the target: only the first e of the guess is Y
        ("geese", "these", "__GGG"),  # the greens use up every e: the e in position 2 is _
        ("lever", "eerie", "_G_YY"),
        ("hello", "world", "___GY"),  # the l in place takes the target's only l
        ("mamma", "maxim", "GGY__"),
        ("allee", "eagle", "YY_YG"),
    ],
)
def test_score_guess(guess, target, marks):
    assert score_guess(guess, target) == marks


def test_wordle_rules():
    env = WordleEnv()
    assert "6 guesses" in env.reset(target="jelly")
    # Invalid guesses are explained and do not use a guess.
    assert "must be exactly five letters" in env.guess("jam")
    assert "not in the word list" in env.guess("zzzzz")
    assert "6 left" in env.guess("jam")
    feedback = env.guess("Apple")
    assert "Guess 1 of 6: A P P L E" in feedback
    assert "Result:       _ _ _ G Y" in feedback and "G: right letter, right spot" in feedback
    assert "5 guesses left." in feedback
    assert env.get_reward() == pytest.approx(0.15)  # (1 green + 0.5 * 1 yellow) / 10
    for word in ("crane", "stone"):
        env.guess(word)
    assert "2 guesses left." in env.guess("money")
    assert "1 guess left." in env.guess("river")
    last = env.guess("tiger")
    assert env.done and "The word was 'jelly'" in last
    assert env.get_reward() == pytest.approx(0.05)  # tiger vs jelly: "___Y_"
    assert env.guess("jelly") == "The game is over."


def test_wordle_solved():
    env = WordleEnv()
    env.reset(target="crane")
    assert env.get_reward() == 0.0
    assert "Result:       G G G _ G" in env.guess("crate")
    text = env.guess("crane")
    assert "Guess 2 of 6" in text
    assert env.done and "You found the word!" in text and env.get_reward() == 1.0


def test_wordle_rejects_a_bad_target():
    with pytest.raises(ValueError, match="five-letter"):
        WordleEnv().reset(target="cat")


async def test_wordle_through_the_factory():
    spec = get_env_spec("wordle")
    sample = Sample(prompt=spec.samples(1, 0)[0].prompt, task_name="wordle", row={"target": "crane"})
    guesses = iter(["house", "trace", "crane"])
    steps, final = await play(spec.build(), sample, lambda _: call("guess", word=next(guesses)))
    assert [st.terminated for st in steps] == [False, False, True]
    assert "Result:       _ G G Y G" in steps[1].messages[0].content
    assert final == 1.0


def test_wordle_targets_come_from_the_word_list():
    assert {s.row["target"] for s in wordle.samples(30, 0)} <= set(WORDS)


# -- guess_number ------------------------------------------------------------------------------


def bisect_policy():
    low, high = 1, 20
    state = {"guess": None}

    def policy(text: str) -> Message:
        nonlocal low, high
        if text == "Too high.":
            high = state["guess"] - 1
        elif text == "Too low.":
            low = state["guess"] + 1
        state["guess"] = (low + high) // 2
        return Message("assistant", f"My guess is {state['guess']}")

    return policy


async def test_guess_number_binary_search_always_wins():
    env = get_env_spec("guess_number").build()
    for target in range(1, 21):
        sample = Sample(
            prompt=(Message("user", guess_number.prompt_text()),),
            task_name="guess_number",
            row={"metadata": {"target": target, "low": 1, "high": 20, "max_guesses": 6}},
        )
        steps, final = await play(env, sample, bisect_policy())
        assert 1 <= len(steps) <= 5
        assert steps[-1].terminated and steps[-1].reward == 1.0
        assert steps[-1].messages == (Message("user", "Correct!"),)
        assert sum(st.reward for st in steps) == 1.0 and final == 0.0
        assert all(st.stop is None for st in steps)


async def test_guess_number_gives_up_after_max_guesses():
    spec = get_env_spec("guess_number")
    sample = spec.samples(1, 0)[0]
    target = sample.row["metadata"]["target"]
    wrong = 20 if target != 20 else 1
    replies = iter(["no idea", "42", str(wrong), str(wrong), str(wrong), str(wrong)])
    env = spec.build()
    session = env.open(sample)
    conversation = list((await session.reset(sample)).prompt)
    observed = []
    for text in replies:
        conversation.append(Message("assistant", text))
        step = await session.step(tuple(conversation))
        observed.append(step.messages[0].content)
        conversation.extend(step.messages)
    assert observed[0] == "Please reply with a single number between 1 and 20."
    assert observed[1] == "42 is not between 1 and 20."
    assert observed[2] == ("Too high." if wrong > target else "Too low.")
    assert observed[-1].endswith(f"Out of guesses: the number was {target}.")
    assert step.terminated and step.reward == 0.0
    assert session.metadata["guesses"] == 6
