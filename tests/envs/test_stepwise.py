"""StepwiseEnvironment: batching of concurrent steps, metadata flow, validation of returns."""

from __future__ import annotations

import asyncio
import math
import threading
from collections import namedtuple
from typing import Any

import pytest

from rollforge.envs.base import EnvSession, Environment, Reset, Step
from rollforge.envs.stepwise import StepwiseEnvironment, StepwiseReturn
from rollforge.errors import ConfigError, EnvironmentError_
from rollforge.testing import HANG_SECONDS
from rollforge.types import Message, Sample

# NeMo-RL's EnvironmentReturn, as user code defines or imports it (note the extra `answers`).
EnvironmentReturn = namedtuple(
    "EnvironmentReturn",
    ["observations", "metadata", "next_stop_strings", "rewards", "terminateds", "answers"],
)


class CountingEnv:
    """Replies "seen: <last content>", rewards the reply length, counts turns in metadata and
    terminates at ``turns``; records every batch it is given."""

    def __init__(self, turns: int = 3):
        self.turns = turns
        self.batches: list[list[list[dict]]] = []
        self.metadata_seen: list[list[Any]] = []
        self.threads: list[int] = []

    def step(self, message_logs: list[list[dict]], metadata: list[Any]) -> StepwiseReturn:
        self.batches.append(message_logs)
        self.metadata_seen.append(metadata)
        self.threads.append(threading.get_ident())
        new_metadata = [{**m, "turn": m.get("turn", 0) + 1} for m in metadata]
        return StepwiseReturn(
            observations=[{"role": "user", "content": f"seen: {log[-1]['content']}"} for log in message_logs],
            metadata=new_metadata,
            next_stop_strings=[[f"</{m['id']}>"] for m in metadata],
            rewards=[float(len(log[-1]["content"])) for log in message_logs],
            terminateds=[m["turn"] >= self.turns for m in new_metadata],
        )


def sample(i: int, **row: Any) -> Sample:
    return Sample(prompt=(Message("user", f"question {i}"),), task_name="count", row=row or {"id": i})


def reply(conversation: tuple[Message, ...], text: str) -> tuple[Message, ...]:
    return (*conversation, Message("assistant", text))


async def open_all(env: StepwiseEnvironment, n: int) -> tuple[list[EnvSession], list[tuple[Message, ...]]]:
    sessions = [env.open(sample(i)) for i in range(n)]
    resets = [await s.reset(sample(i)) for i, s in enumerate(sessions)]
    return sessions, [r.prompt for r in resets]


def test_is_an_environment_with_sessions():
    env = StepwiseEnvironment(CountingEnv(), max_sessions=4)
    assert isinstance(env, Environment)
    assert env.max_sessions == 4
    session = env.open(sample(0))
    assert isinstance(session, EnvSession)
    assert session.handle is env.env


async def test_reset_returns_the_sample_prompt_and_metadata_from_the_row():
    env = StepwiseEnvironment(CountingEnv())
    s = Sample(prompt=(Message("system", "be brief"), Message("user", "hi")), row={"metadata": {"answer": 7}})
    session = env.open(s)
    assert await session.reset(s) == Reset(prompt=s.prompt)
    assert session.metadata == {"answer": 7}
    # Without a "metadata" column the whole row is the metadata.
    other = sample(3, id=3, level="easy")
    session = env.open(other)
    await session.reset(other)
    assert session.metadata == {"id": 3, "level": "easy"}


async def test_concurrent_steps_coalesce_into_one_batched_call():
    user_env = CountingEnv()
    env = StepwiseEnvironment(user_env)
    sessions, prompts = await open_all(env, 8)

    steps = await asyncio.gather(*(s.step(reply(p, f"answer {i}")) for i, (s, p) in enumerate(zip(sessions, prompts))))

    assert [len(batch) for batch in user_env.batches] == [8]
    # Each session gets its own share, in its own order.
    for i, step in enumerate(steps):
        assert step.messages == (Message("user", f"seen: answer {i}"),)
        assert step.reward == float(len(f"answer {i}"))
        assert step.stop == (f"</{i}>",)
        assert step.terminated is False
    # The env saw the whole conversation as role/content dicts.
    assert user_env.batches[0][2] == [
        {"role": "user", "content": "question 2"},
        {"role": "assistant", "content": "answer 2"},
    ]


async def test_lockstep_turns_make_one_call_per_turn_and_carry_metadata():
    user_env = CountingEnv(turns=3)
    env = StepwiseEnvironment(user_env)
    sessions, conversations = await open_all(env, 4)
    finished = [False] * 4
    for turn in range(3):
        steps = await asyncio.gather(*(s.step(reply(c, f"t{turn}")) for s, c in zip(sessions, conversations)))
        conversations = [(*reply(c, f"t{turn}"), *st.messages) for c, st in zip(conversations, steps)]
        finished = [st.terminated for st in steps]
    assert [len(b) for b in user_env.batches] == [4, 4, 4]
    assert finished == [True] * 4
    assert [m["turn"] for m in user_env.metadata_seen[2]] == [2, 2, 2, 2]
    assert [s.metadata for s in sessions] == [{"id": i, "turn": 3} for i in range(4)]


async def test_steps_wrapped_in_wait_for_still_coalesce():
    # wait_for runs each step in its own task, one loop iteration later: still one batch.
    user_env = CountingEnv()
    env = StepwiseEnvironment(user_env)
    sessions, prompts = await open_all(env, 5)
    await asyncio.gather(*(asyncio.wait_for(s.step(reply(p, "x")), HANG_SECONDS) for s, p in zip(sessions, prompts)))
    assert [len(b) for b in user_env.batches] == [5]


async def test_steps_far_apart_make_separate_calls():
    user_env = CountingEnv()
    env = StepwiseEnvironment(user_env)
    sessions, prompts = await open_all(env, 3)
    await sessions[0].step(reply(prompts[0], "a"))  # its batch is done before the others step
    await asyncio.gather(*(s.step(reply(p, "b")) for s, p in zip(sessions[1:], prompts[1:])))
    assert [len(b) for b in user_env.batches] == [1, 2]


async def settle() -> None:
    """Let every ready task run until it waits (a number of loop passes, not a time)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_env_sees_one_call_at_a_time_and_late_arrivals_form_the_next_batch():
    entered, release = threading.Event(), threading.Event()

    class Slow:
        """Its first call holds until released; every call counts how many run at once."""

        def __init__(self):
            self.running = 0
            self.most_running = 0
            self.batches: list[int] = []
            self.lock = threading.Lock()

        def step(self, message_logs, metadata):
            with self.lock:
                self.running += 1
                self.most_running = max(self.most_running, self.running)
            if not self.batches:
                entered.set()
                release.wait(HANG_SECONDS)
            with self.lock:
                self.running -= 1
            self.batches.append(len(message_logs))
            n = len(message_logs)
            return StepwiseReturn([{"content": "."}] * n, metadata, [None] * n, [1.0] * n, [False] * n)

    user_env = Slow()
    env = StepwiseEnvironment(user_env)
    sessions, prompts = await open_all(env, 5)
    early = [asyncio.create_task(s.step(reply(p, "x"))) for s, p in zip(sessions[:2], prompts[:2])]
    assert await asyncio.to_thread(entered.wait, HANG_SECONDS)  # the first batch is running in its thread
    late = [asyncio.create_task(s.step(reply(p, "x"))) for s, p in zip(sessions[2:], prompts[2:])]
    await settle()  # the late steps are queued while it runs
    release.set()
    await asyncio.wait_for(asyncio.gather(*early, *late), HANG_SECONDS)
    assert user_env.batches == [2, 3]
    assert user_env.most_running == 1


async def test_a_hung_batch_that_every_caller_gave_up_on_does_not_block_the_next():
    entered, release = threading.Event(), threading.Event()

    class HangsOnce:
        calls = 0

        def step(self, message_logs, metadata):
            HangsOnce.calls += 1
            if HangsOnce.calls == 1:
                entered.set()
                release.wait()  # hung until the test ends: a later batch must not wait for it
            n = len(message_logs)
            return StepwiseReturn([{"content": "."}] * n, metadata, [None] * n, [1.0] * n, [True] * n)

    env = StepwiseEnvironment(HangsOnce())
    sessions, prompts = await open_all(env, 2)
    try:
        first = asyncio.create_task(sessions[0].step(reply(prompts[0], "x")))
        assert await asyncio.to_thread(entered.wait, HANG_SECONDS)
        first.cancel()  # its only caller gives up, as the engine's step timeout does
        with pytest.raises(asyncio.CancelledError):
            await first
        step = await asyncio.wait_for(sessions[1].step(reply(prompts[1], "x")), HANG_SECONDS)
        assert step.reward == 1.0 and HangsOnce.calls == 2 and not release.is_set()
    finally:
        release.set()


async def test_sync_step_runs_in_a_worker_thread_unless_disabled():
    threaded = CountingEnv()
    session = StepwiseEnvironment(threaded).open(sample(0))
    prompt = (await session.reset(sample(0))).prompt
    await session.step(reply(prompt, "x"))
    assert threaded.threads[0] != threading.get_ident()

    inline = CountingEnv()
    session = StepwiseEnvironment(inline, run_in_thread=False).open(sample(0))
    await session.step(reply(prompt, "x"))
    assert inline.threads[0] == threading.get_ident()


async def test_async_step_is_awaited_on_the_loop():
    class AsyncEnv:
        calls = 0

        async def step(self, message_logs, metadata):
            AsyncEnv.calls += 1
            await asyncio.sleep(0)
            n = len(message_logs)
            return StepwiseReturn([{"content": "ok"}] * n, metadata, [None] * n, [0.5] * n, [True] * n)

    env = StepwiseEnvironment(AsyncEnv())
    sessions, prompts = await open_all(env, 3)
    steps = await asyncio.gather(*(s.step(reply(p, "x")) for s, p in zip(sessions, prompts)))
    assert AsyncEnv.calls == 1
    # Role defaults to "user"; None stop strings keep the current ones.
    assert steps[0] == Step(messages=(Message("user", "ok"),), reward=0.5, terminated=True, stop=None)


async def test_unchanged_nemo_rl_environment_code_works():
    """A NeMo-RL-style environment: namedtuple return with ``answers``, the "environment" role,
    metadata passed through, and lists of plain floats/bools."""

    class MathEnvironment:
        def step(self, message_logs, metadata):
            results = []
            for conversation, info in zip(message_logs, metadata):
                answer = "".join(m["content"] for m in conversation if m["role"] == "assistant").strip()
                results.append(1.0 if answer == str(info["ground_truth"]) else 0.0)
            observations = [
                {"role": "environment", "content": "Environment: correct" if r else "Environment: incorrect"}
                for r in results
            ]
            return EnvironmentReturn(
                observations=observations,
                metadata=metadata,
                next_stop_strings=[None] * len(message_logs),
                rewards=results,
                terminateds=[True] * len(message_logs),
                answers=[None] * len(message_logs),
            )

    env = StepwiseEnvironment(MathEnvironment())
    samples = [
        Sample(prompt=(Message("user", "2+2?"),), task_name="math", row={"metadata": {"ground_truth": 4}}),
        Sample(prompt=(Message("user", "3+3?"),), task_name="math", row={"metadata": {"ground_truth": 6}}),
    ]
    sessions = [env.open(s) for s in samples]
    for session, s in zip(sessions, samples):
        await session.reset(s)
    right, wrong = await asyncio.gather(
        sessions[0].step(reply(samples[0].prompt, "4")), sessions[1].step(reply(samples[1].prompt, "5"))
    )
    assert right == Step(messages=(Message("user", "Environment: correct"),), reward=1.0, terminated=True)
    assert wrong.reward == 0.0 and wrong.messages[0].content == "Environment: incorrect"
    assert sessions[0].metadata == {"ground_truth": 4}


async def test_tensor_rewards_and_terminateds_are_accepted():
    torch = pytest.importorskip("torch")

    class TensorEnv:
        def step(self, message_logs, metadata):
            n = len(message_logs)
            return EnvironmentReturn(
                observations=[{"role": "environment", "content": ""}] * n,
                metadata=metadata,
                next_stop_strings=[None] * n,
                rewards=torch.tensor([1.0] * n),
                terminateds=torch.tensor([True] * n),
                answers=None,
            )

    env = StepwiseEnvironment(TensorEnv())
    session = env.open(sample(0))
    prompt = (await session.reset(sample(0))).prompt
    step = await session.step(reply(prompt, "x"))
    # Empty content on a terminating step adds no message.
    assert step == Step(messages=(), reward=1.0, terminated=True)
    assert type(step.reward) is float


async def test_numpy_scalars_in_plain_lists_are_accepted():
    np = pytest.importorskip("numpy")

    class NumpyEnv:
        def step(self, message_logs, metadata):
            return StepwiseReturn([{"content": "ok"}], metadata, [None], [np.float32(0.5)], [np.bool_(False)])

    session = StepwiseEnvironment(NumpyEnv()).open(sample(0))
    step = await session.step(reply(sample(0).prompt, "x"))
    assert step.reward == 0.5 and type(step.reward) is float and step.terminated is False


@pytest.mark.parametrize(
    ("observation", "terminated", "expected"),
    [
        ({"role": "user", "content": ""}, True, ()),
        ({"role": "user", "content": ""}, False, (Message("user", ""),)),
        ({"content": None}, True, ()),
        ({"role": "tool", "content": "result", "name": "calc"}, False, (Message("tool", "result", name="calc"),)),
        ({"role": "environment", "content": "hint"}, False, (Message("user", "hint"),)),
    ],
)
async def test_observation_becomes_a_message(observation, terminated, expected):
    class OneObservation:
        def step(self, message_logs, metadata):
            return StepwiseReturn([observation], metadata, [None], [0.0], [terminated])

    session = StepwiseEnvironment(OneObservation()).open(sample(0))
    step = await session.step(reply(sample(0).prompt, "x"))
    assert step.messages == expected


async def test_truncateds_say_a_limit_ended_the_episode_and_default_to_none():
    class OutOfTime:
        def step(self, message_logs, metadata):  # the first sample solved it; the second ran out of time
            return StepwiseReturn(
                [{"content": "Solved."}, {"content": ""}],
                metadata,
                [None, None],
                [1.0, 0.0],
                terminateds=[True, False],
                truncateds=[False, True],
            )

    sessions, prompts = await open_all(StepwiseEnvironment(OutOfTime()), 2)
    steps = await asyncio.gather(*(s.step(reply(p, "x")) for s, p in zip(sessions, prompts)))
    assert steps == [
        Step(messages=(Message("user", "Solved."),), reward=1.0, terminated=True),
        Step(messages=(), reward=0.0, truncated=True),
    ]  # empty content on an ending step: no message
    nemo = await open_all(StepwiseEnvironment(CountingEnv(turns=1)), 1)  # no truncateds at all
    step = await nemo[0][0].step(reply(nemo[1][0], "x"))
    assert step.terminated and not step.truncated


async def test_initial_metadata_is_a_copy_so_in_place_mutation_does_not_leak():
    class Mutating:
        def step(self, message_logs, metadata):
            for info in metadata:
                info["visits"].append(1)
            return StepwiseReturn([{"content": "."}], metadata, [None], [0.0], [False])

    s = Sample(prompt=(Message("user", "q"),), row={"metadata": {"visits": []}})
    for _ in range(2):
        session = StepwiseEnvironment(Mutating()).open(s)
        await session.reset(s)
        await session.step(reply(s.prompt, "x"))
        assert session.metadata == {"visits": [1]}
    assert s.row["metadata"] == {"visits": []}


class WrongLength:
    def step(self, message_logs, metadata):
        n = len(message_logs)
        return StepwiseReturn([{"content": "."}] * n, metadata, [None] * n, [0.0] * (n - 1), [False] * n)


class Raising:
    calls = 0

    def step(self, message_logs, metadata):
        Raising.calls += 1
        if Raising.calls == 1:
            raise ValueError("grader crashed")
        n = len(message_logs)
        return StepwiseReturn([{"content": "."}] * n, metadata, [None] * n, [1.0] * n, [True] * n)


async def test_length_mismatch_fails_every_episode_of_the_batch_naming_env_and_field():
    env = StepwiseEnvironment(WrongLength())
    sessions, prompts = await open_all(env, 3)
    results = await asyncio.gather(*(s.step(reply(p, "x")) for s, p in zip(sessions, prompts)), return_exceptions=True)
    assert all(isinstance(r, EnvironmentError_) for r in results)
    message = str(results[0])
    assert "WrongLength.step" in message and "batch of 3" in message and "returned 2 rewards" in message


async def test_an_exception_from_step_fails_its_batch_only():
    env = StepwiseEnvironment(Raising())
    sessions, prompts = await open_all(env, 3)
    results = await asyncio.gather(*(s.step(reply(p, "x")) for s, p in zip(sessions, prompts)), return_exceptions=True)
    assert [type(r) for r in results] == [ValueError] * 3
    assert str(results[0]) == "grader crashed"
    # The next batch is unaffected.
    steps = await asyncio.gather(*(s.step(reply(p, "y")) for s, p in zip(sessions, prompts)))
    assert [st.reward for st in steps] == [1.0, 1.0, 1.0]


async def test_a_cancelled_step_does_not_disturb_its_batch():
    entered, release, batches = asyncio.Event(), asyncio.Event(), []

    class Slow:
        async def step(self, message_logs, metadata):
            batches.append(len(message_logs))
            entered.set()
            await release.wait()
            n = len(message_logs)
            return StepwiseReturn([{"content": "done"}] * n, metadata, [None] * n, [1.0] * n, [True] * n)

    env = StepwiseEnvironment(Slow())
    sessions, prompts = await open_all(env, 2)
    impatient = asyncio.create_task(sessions[0].step(reply(prompts[0], "x")))
    patient = asyncio.create_task(sessions[1].step(reply(prompts[1], "x")))
    await asyncio.wait_for(entered.wait(), HANG_SECONDS)
    impatient.cancel()  # while its batch runs
    await settle()
    release.set()
    results = await asyncio.wait_for(asyncio.gather(impatient, patient, return_exceptions=True), HANG_SECONDS)
    assert batches == [2] and isinstance(results[0], asyncio.CancelledError)
    assert results[1].reward == 1.0


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("rewards", ["1"], "reward must be a number"),
        ("rewards", [math.nan], "reward must be finite"),
        ("terminateds", ["yes"], "terminated must be a bool"),
        ("truncateds", [2], "truncated must be a bool, got 2"),
        ("truncateds", [True, False], "returned 2 truncateds; every field needs one entry per sample"),
        ("next_stop_strings", ["</answer>"], "next_stop_strings must be a list of str or None"),
        ("observations", ["plain text"], "an observation must be a {'role', 'content'} dict"),
        ("observations", [{"role": "robot", "content": "hi"}], "observation role 'robot'"),
        ("metadata", None, "returned metadata of type NoneType"),
    ],
)
async def test_bad_returns_are_reported(field, value, complaint):
    class Bad:
        def step(self, message_logs, metadata):
            fields = dict(
                observations=[{"content": "."}],
                metadata=metadata,
                next_stop_strings=[None],
                rewards=[0.0],
                terminateds=[False],
            )
            fields[field] = value
            return StepwiseReturn(**fields)

    session = StepwiseEnvironment(Bad()).open(sample(0))
    with pytest.raises(EnvironmentError_, match="Bad.step") as info:
        await session.step(reply(sample(0).prompt, "x"))
    assert complaint in str(info.value)


async def test_a_return_without_the_fields_is_reported():
    class ReturnsDict:
        def step(self, message_logs, metadata):
            return {"observations": [], "rewards": []}

    session = StepwiseEnvironment(ReturnsDict()).open(sample(0))
    with pytest.raises(EnvironmentError_, match="ReturnsDict.step returned a dict without 'observations'"):
        await session.step(reply(sample(0).prompt, "x"))


def test_construction_errors():
    with pytest.raises(ConfigError, match="needs a step"):
        StepwiseEnvironment(object())
    with pytest.raises(ConfigError, match="max_sessions"):
        StepwiseEnvironment(CountingEnv(), max_sessions=0)


def test_one_environment_serves_several_event_loops():
    user_env = CountingEnv()
    env = StepwiseEnvironment(user_env)

    async def one_turn() -> list[Step]:
        sessions, prompts = await open_all(env, 2)
        return await asyncio.gather(*(s.step(reply(p, "x")) for s, p in zip(sessions, prompts)))

    first = asyncio.run(one_turn())
    second = asyncio.run(one_turn())
    assert first == second
    assert [len(b) for b in user_env.batches] == [2, 2]
