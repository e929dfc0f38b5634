"""Task-library adapters: reasoning-gym, textarena, gymnasium and math-verify as environments.

Each library is an optional extra; a test module section skips (with the reason) only when its
library is not installed. CI installs them (``.[tasks]``), so there they all run.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections import deque

import pytest

from rollforge.envs.adapters.math_env import MathVerifyEnv, VerifyWorker
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError, MissingDependency
from rollforge.testing import wait_until
from rollforge.types import Message, Sample, ToolCall


def needs(module: str):
    try:
        __import__(module)
        missing = None
    except ImportError as exc:
        missing = f"{module} is not installed ({exc})"
    return pytest.mark.skipif(missing is not None, reason=missing or "")


async def play(spec_name: str, sample: Sample, policy, turns: int = 30):
    """Play one episode; ``policy(conversation)`` returns the next assistant message."""
    env = get_env_spec(spec_name).build()
    session = env.open(sample)
    conversation = list((await session.reset(sample)).prompt)
    steps = []
    try:
        for _ in range(turns):
            conversation.append(policy(conversation))
            step = await session.step(tuple(conversation))
            steps.append(step)
            conversation.extend(step.messages)
            if step.terminated:
                break
        return steps, await session.finish(), session.metadata, conversation
    finally:
        await session.close()


@pytest.mark.parametrize(
    ("name", "module", "extra"),
    [
        ("reasoning_gym:leg_counting", "reasoning_gym", "reasoning-gym"),
        ("textarena:Mastermind-v0", "textarena", "textarena"),
        ("gymnasium:CliffWalking-v1", "gymnasium", "gymnasium"),
    ],
)
def test_a_missing_library_names_its_extra(monkeypatch, name, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    from rollforge.envs.library import family_member

    family_member.cache_clear()
    with pytest.raises(MissingDependency, match=rf"pip install 'rollforge\[{extra}\]'"):
        get_env_spec(name)
    family_member.cache_clear()


def test_math_without_math_verify_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(MissingDependency, match=r"rollforge\[math\]"):
        get_env_spec("math").build()


def test_unknown_family_members_are_config_errors():
    with pytest.raises(ConfigError, match="families: reasoning_gym:<name>, textarena:<name>, gymnasium:<name>"):
        get_env_spec("openspiel:chess")


# -- reasoning-gym ----------------------------------------------------------------------------------


@needs("reasoning_gym")
@pytest.mark.parametrize(
    ("template", "reward", "extracted"),
    [
        ("Two legs each. <answer>{answer}</answer>", 1.0, "{answer}"),
        ("<answer> banana </answer>", 0.0, "banana"),
        ("{answer}", 0.0, None),  # no tags: reasoning-gym's extract_answer finds nothing
    ],
)
async def test_reasoning_gym_scores_with_the_library(template, reward, extracted):
    sample = get_env_spec("reasoning_gym:leg_counting").samples(1, 4)[0]
    entry = sample.row["metadata"]["entry"]
    assert sample.task_name == "reasoning_gym:leg_counting" and sample.prompt[-1].content == entry["question"]
    assert "<answer>" in sample.prompt[0].content  # reasoning-gym's own system prompt
    reply = Message("assistant", template.format(answer=entry["answer"]))
    steps, final, metadata, _ = await play("reasoning_gym:leg_counting", sample, lambda _: reply)
    assert len(steps) == 1 and steps[0].terminated and steps[0].messages == ()
    assert steps[0].reward == reward and final == 0.0
    assert metadata["extracted_answer"] == (extracted and extracted.format(answer=entry["answer"]))


@needs("reasoning_gym")
def test_reasoning_gym_unknown_dataset_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown reasoning_gym dataset 'leg_count'; close names: leg_counting"):
        get_env_spec("reasoning_gym:leg_count")


# -- textarena --------------------------------------------------------------------------------------


@needs("textarena")
async def test_textarena_guess_the_number_binary_search_wins():
    sample = get_env_spec("textarena:GuessTheNumber-v0").samples(1, 2)[0]
    bounds = {"low": 1, "high": 20}

    def bisect(conversation):
        last = conversation[-1].content
        guess = (bounds["low"] + bounds["high"]) // 2
        if conversation[-1].role == "user" and len(conversation) > 2:
            previous = int(conversation[-2].content.strip("[]"))
            if "higher" in last:
                bounds["low"] = previous + 1
            elif "lower" in last:
                bounds["high"] = previous - 1
            guess = (bounds["low"] + bounds["high"]) // 2
        return Message("assistant", str(guess))  # no brackets: wrapped like textarena's wrapper does

    steps, final, _, conversation = await play("textarena:GuessTheNumber-v0", sample, bisect)
    assert "guess the number between 1 and 20" in conversation[1].content
    assert 1 <= len(steps) <= 5 and steps[-1].terminated
    assert steps[-1].reward == 1.0 and sum(s.reward for s in steps) == 1.0
    assert "Game over: Congratulations!" in steps[-1].messages[0].content


@needs("textarena")
async def test_textarena_invalid_moves_are_explained():
    sample = get_env_spec("textarena:Mastermind-v0").samples(1, 0)[0]
    steps, _, _, _ = await play(
        "textarena:Mastermind-v0", sample, lambda _: Message("assistant", "I think [1 2]"), turns=1
    )
    assert "exactly 4 numbers" in steps[0].messages[0].content and not steps[0].terminated


NLTK_BANNER = """
**********************************************************************
  Resource 'words' not found.
  Please use the NLTK Downloader to obtain the resource:

  >>> import nltk
  >>> nltk.download('words')

  Attempted to load 'corpora/words'
**********************************************************************
"""


@needs("textarena")
async def test_textarena_missing_nltk_data_is_one_line_at_start(monkeypatch):
    # Wordle without NLTK's corpus (offline): NLTK's 25-line banner used to fail every episode.
    from types import SimpleNamespace

    from rollforge.envs.adapters import textarena_env
    from rollforge.errors import EnvironmentError_

    def make(env_id):
        raise LookupError(NLTK_BANNER)

    monkeypatch.setattr(textarena_env, "_ta", lambda: SimpleNamespace(make=make))
    expected = (
        "textarena game 'Wordle-v0' needs NLTK's 'words' data, which is not installed (NLTK downloads "
        "it on first use, which needs the network): run python -m nltk.downloader words"
    )
    with pytest.raises(ConfigError) as info:
        textarena_env.build("Wordle-v0")
    assert str(info.value) == expected
    session = textarena_env.TextArenaSession("Wordle-v0")  # data removed after start-up: one line too
    with pytest.raises(EnvironmentError_) as failed:
        await session.reset(Sample(prompt=[{"role": "user", "content": "Play."}], row={"seed": 1}))
    assert str(failed.value) == expected


@needs("textarena")
def test_textarena_unknown_game_suggests_names():
    with pytest.raises(ConfigError, match="unknown textarena game 'Mastermind'; close names: Mastermind-v0"):
        get_env_spec("textarena:Mastermind")


# -- gymnasium --------------------------------------------------------------------------------------


def shortest_path(board: list[list[str]]) -> list[str]:
    """Directions from P to G avoiding holes (breadth-first search)."""
    start = next((r, c) for r, row in enumerate(board) for c, cell in enumerate(row) if cell == "P")
    moves = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
    queue, seen = deque([(start, [])]), {start}
    while queue:
        (r, c), path = queue.popleft()
        if board[r][c] == "G":
            return path
        for name, (dr, dc) in moves.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < 4 and 0 <= nc < 4 and (nr, nc) not in seen and board[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append(((nr, nc), [*path, name]))
    raise AssertionError("generate_random_map always leaves a path")


def move(direction: str) -> Message:
    return Message("assistant", "", tool_calls=(ToolCall("move", {"direction": direction}),))


@needs("gymnasium")
@pytest.mark.parametrize("seed", range(3))
async def test_frozenlake_shortest_path_reaches_the_goal(seed):
    sample = get_env_spec("frozenlake").samples(1, seed)[0]
    env = get_env_spec("frozenlake").build()
    session = env.open(sample)
    reset = await session.reset(sample)
    board = [line.split() for line in reset.prompt[-1].content.split("\n\n")[-1].splitlines()]
    assert len(board) == 4 and board[0][0] == "P" and board[3][3] == "G"
    path = shortest_path(board)
    conversation = list(reset.prompt)
    for direction in path:
        conversation.append(move(direction))
        step = await session.step(tuple(conversation))
        conversation.extend(step.messages)
    assert step.terminated and "You reached the goal!" in step.messages[0].content
    assert await session.finish() == 1.0
    await session.close()


@needs("gymnasium")
async def test_frozenlake_out_of_moves_is_truncated_not_terminated():
    sample = get_env_spec("frozenlake").samples(1, 0)[0]
    session = get_env_spec("frozenlake").build().open(sample)
    reset = await session.reset(sample)
    step = await session.step((*reset.prompt, Message("assistant", "", tool_calls=move("left").tool_calls * 16)))
    assert (
        step.truncated and not step.terminated and len(step.messages) == 16
    )  # against the wall: gymnasium's TimeLimit
    assert "out of steps: total reward 0." in step.messages[-1].content
    assert await session.finish() == 0.0
    await session.close()


@needs("gymnasium")
async def test_frozenlake_rejects_a_bad_direction_and_ends_in_a_hole():
    sample = get_env_spec("frozenlake").samples(1, 0)[0]
    env = get_env_spec("frozenlake").build()
    session = env.open(sample)
    reset = await session.reset(sample)
    step = await session.step((*reset.prompt, move("stay")))
    assert step.failures[0].kind == "tool_bad_arguments" and not step.terminated
    assert [t["function"]["parameters"]["properties"]["direction"]["enum"] for t in reset.tools] == [
        ["left", "down", "right", "up"]
    ]
    await session.close()


@needs("gymnasium")
def test_gymnasium_family_needs_text_and_discrete_actions():
    with pytest.raises(ConfigError, match="'CartPole-v1' has no text rendering"):
        get_env_spec("gymnasium:CartPole-v1")
    with pytest.raises(ConfigError, match="unknown gymnasium environment 'Nope-v0'"):
        get_env_spec("gymnasium:Nope-v0")


# -- math-verify ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def math_env():
    """One environment (one worker process, started once) for the verdict tests."""
    env = MathVerifyEnv()
    yield env
    env.worker.close()


@needs("math_verify")
@pytest.mark.parametrize(
    ("gold", "reply", "reward"),
    [
        ("\\frac{1}{2}", "So the answer is \\boxed{0.5}.", 1.0),
        ("\\frac{19}{12}", "\\boxed{19/12}", 1.0),
        ("5\\sqrt{2}", "\\boxed{\\sqrt{50}}", 1.0),
        ("20x", "We get \\boxed{20 x}", 1.0),
        ("\\frac{19}{12}", "\\boxed{\\frac{12}{19}}", 0.0),
        ("7", "I do not know.", 0.0),
    ],
)
def test_math_verify_accepts_equivalent_forms(math_env, gold, reply, reward):
    result = math_env.step(
        [[{"role": "user", "content": "q"}, {"role": "assistant", "content": reply}]], [{"answer": gold}]
    )
    assert result.rewards == [reward] and result.terminateds == [True]
    assert result.metadata[0]["verdict"] == ("correct" if reward else "wrong")


@needs("math_verify")
async def test_math_runs_off_the_main_thread_without_alarms():
    before = signal.getsignal(signal.SIGALRM)
    spec = get_env_spec("math")
    samples = spec.samples(4, 1)
    env = spec.build()
    sessions = [env.open(s) for s in samples]
    for session, sample in zip(sessions, samples):
        await session.reset(sample)
    replies = [f"\\boxed{{{s.row['metadata']['answer']}}}" for s in samples[:3]] + ["\\boxed{123456}"]
    steps = await asyncio.gather(  # one batch, stepped in a worker thread
        *(sess.step((*s.prompt, Message("assistant", r))) for sess, s, r in zip(sessions, samples, replies))
    )
    env.env.worker.close()
    assert [st.reward for st in steps] == [1.0, 1.0, 1.0, 0.0]
    assert threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGALRM) == before


def test_a_verification_that_hangs_is_killed_and_the_worker_restarts(monkeypatch):
    worker = VerifyWorker(timeout=0.5)
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    real_popen, started = __import__("subprocess").Popen, []

    def popen(command, **kwargs):
        started.append(real_popen(hang, **kwargs))
        return started[-1]

    monkeypatch.setattr("rollforge.envs.adapters.math_env.subprocess.Popen", popen)
    assert worker.verify("1", "1", first_start_grace=0.0) == (False, "timeout")
    assert worker._process is None and len(started) == 1
    # killed, not left running (its sleep would last a minute)
    assert wait_until(lambda: started[0].poll() is not None) and started[0].returncode < 0
    assert worker.verify("1", "1", first_start_grace=0.0) == (False, "timeout")  # a fresh worker each time
    assert len(started) == 2 and wait_until(lambda: started[1].poll() is not None)
    with pytest.raises(ConfigError, match="positive number of seconds, got 0"):
        VerifyWorker(timeout=0)


@needs("math_verify")
def test_math_problems_are_deterministic_and_well_formed():
    samples = get_env_spec("math").samples(8, 3)
    assert samples[:4] == get_env_spec("math").samples(4, 3)
    kinds = {s.row["metadata"]["kind"] for s in get_env_spec("math").samples(40, 0)}
    assert kinds == {"fraction_sum", "linear_equation", "square_root", "difference_of_squares"}
    assert all("\\boxed{}" in s.prompt[0].content for s in samples)
