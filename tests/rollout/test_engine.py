"""Engine semantics with a scripted backend and the tiny test tokenizer (real chat template)."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.envs.factory import FactoryEnvironment
from rollforge.errors import ConfigError
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import HANG_SECONDS, assert_faithful
from rollforge.types import Message, Sample


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def backend(renderer, script, **kwargs):
    return ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0], **kwargs)


class Scripted(BaseSession):
    """A step-style session whose behaviour per turn is given by a function of the turn number."""

    def __init__(self, behave):
        self.behave, self.turn = behave, 0

    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        self.turn += 1
        return await self.behave(self.turn, conversation)


class Env(Environment):
    def __init__(self, behave, max_sessions=None):
        self.behave, self.max_sessions = behave, max_sessions

    def open(self, sample):
        return Scripted(self.behave)


async def observe(turn, conversation):
    return Step(messages=(Message("user", f"observation {turn}"),), reward=0.25, terminated=turn == 3)


class Counter:
    """A TRL-style environment class: plain Python, no rollforge imports."""

    def reset(self, **kwargs) -> str:
        self.total = kwargs.get("start", 0)
        return f"The counter starts at {self.total}."

    def add(self, n: int) -> str:
        """Add to the counter.

        Args:
            n: How much to add.
        """
        self.total += n
        return f"total={self.total}"

    def get_reward(self) -> float:
        return 1.0 if self.total == 5 else 0.0


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Task number {i}."}]


def add_or_answer(renderer):
    def script(request) -> str:
        tail = renderer.decode(request.prompt_ids[-20:])
        if "total=5" in tail:
            return "The total is five."
        return '<tool_call>\n{"name": "add", "arguments": {"n": 1}}\n</tool_call>'

    return script


async def test_async_and_lockstep_give_identical_trajectories(renderer):
    samples = [
        Sample(prompt=prompt(i), task_name="count" if i % 2 else "observe", row={"start": i % 3}) for i in range(8)
    ]
    envs = {"observe": Env(observe), "count": FactoryEnvironment(Counter)}
    results = {}
    for mode in ("async", "lockstep"):
        config = RolloutConfig(mode=mode, max_turns=6, concurrency=3)
        results[mode] = await arollout(samples, envs, backend(renderer, add_or_answer(renderer)), renderer, config)
    a, b = results["async"].trajectories, results["lockstep"].trajectories
    assert [t.index for t in a] == list(range(8))
    for x, y in zip(a, b):
        assert (x.token_ids, x.loss_mask, x.logprobs, x.rewards, x.messages) == (
            y.token_ids,
            y.loss_mask,
            y.logprobs,
            y.rewards,
            y.messages,
        )
    # observe: 3 turns of 0.25; count from start s needs 5 - s adds, then an answer, reward 1.
    assert [t.total_reward for t in a] == [0.75, 1.0, 0.75, 1.0, 0.75, 1.0, 0.75, 1.0]
    # starts 1, 0, 2, 1: (5 - start) calls to add, then the answer
    assert [t.turns for t in a[1::2]] == [5, 6, 4, 5]
    assert all(t.terminated for t in a)
    assert a[0].messages[-1] == Message("user", "observation 3") and a[0].terminated
    assert_faithful(a, renderer)


async def test_observation_cut_at_max_seq_len_marks_truncated(renderer):
    async def long_observation(turn, conversation):
        return Step(messages=(Message("user", "word " * 300),))

    config = RolloutConfig(max_turns=4, max_seq_len=120)
    result = await arollout(
        [Sample(prompt=prompt(0))],
        {"default": Env(long_observation)},
        backend(renderer, lambda r: "ok"),
        renderer,
        config,
    )
    t = result.trajectories[0]
    assert t.truncated and not t.terminated and t.turns == 1
    assert len(t.token_ids) == 120
    assert result.metrics["truncation_rate"] == 1.0
    assert_faithful([t], renderer)


async def test_per_turn_stop_strings(renderer):
    async def set_stop(turn, conversation):
        return Step(messages=(Message("user", "again"),), stop=("</answer>",), terminated=turn == 2)

    script = lambda r: "<answer>7</answer> and more text"
    result = await arollout(
        [Sample(prompt=prompt(0))],
        {"default": Env(set_stop)},
        backend(renderer, script),
        renderer,
        RolloutConfig(max_turns=3),
    )
    first, second = [m for m in result.trajectories[0].messages if m.role == "assistant"]
    assert first.content == "<answer>7</answer> and more text"  # no stop strings on turn 1
    assert second.content.endswith("</answer>") and "more" not in second.content
    assert_faithful(result.trajectories, renderer)


async def test_each_malformed_tool_call_is_a_counted_failure_not_a_crash(renderer):
    replies = [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"name": "multiply", "arguments": {"n": 2}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"n": "two"}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"n": 1, "m": 2}}\n</tool_call>',
        '<tool_call>\n{"name": "explode", "arguments": {}}\n</tool_call>',
    ]

    class Fragile(Counter):
        def explode(self) -> str:
            """Always fails."""
            raise RuntimeError("boom")

    turn = iter(range(100))
    result = await arollout(
        [Sample(prompt=prompt(0))],
        {"default": FactoryEnvironment(Fragile)},
        backend(renderer, lambda r: replies[next(turn)]),
        renderer,
        RolloutConfig(max_turns=6),
    )
    t = result.trajectories[0]
    assert t.error is None and t.max_turns_reached and t.turns == 6
    assert result.metrics["failures"] == {
        "tool_bad_arguments": 3,
        "tool_invalid_json": 1,
        "tool_raised": 1,
        "tool_unknown": 1,
    }
    tool_messages = [m.content for m in t.messages if m.role == "tool"]
    assert len(tool_messages) == 6 and "boom" in tool_messages[-1]
    assert_faithful([t], renderer)


async def test_unknown_task_name_raises_before_any_generation(renderer):
    scripted = backend(renderer, lambda r: "hi")
    samples = [Sample(prompt=prompt(0), task_name="observe"), Sample(prompt=prompt(1), task_name="nope")]
    with pytest.raises(ConfigError, match="nope"):
        await arollout(samples, {"observe": Env(observe)}, scripted, renderer)
    assert scripted.calls == 0


async def test_unknown_environment_column_raises_before_any_generation(renderer):
    # The check training and the CLI run (check_routes): rollout() used to fail the episode instead.
    scripted = backend(renderer, lambda r: "hi")
    env = FactoryEnvironment({"counter": Counter, "other": Counter})
    rows = [{"environment": "counter"}, {"environment": "countr"}]
    samples = [Sample(prompt=prompt(i), task_name="multi", row=row) for i, row in enumerate(rows)]
    with pytest.raises(ConfigError) as info:
        await arollout(samples, {"multi": env}, scripted, renderer)
    assert str(info.value) == (
        "prompt row 2 has the value 'countr' in its 'environment' column, but 'multi' has factories "
        "only for ['counter', 'other']"
    )
    with pytest.raises(ConfigError, match=r"prompt row 1 has the value \['counter'\] in its"):
        await arollout(
            [Sample(prompt=prompt(0), task_name="multi", row={"environment": ["counter"]})],
            {"multi": env},
            scripted,
            renderer,
        )
    assert scripted.calls == 0


async def test_raising_and_hanging_environments_fail_only_their_episode(renderer):
    async def raising(turn, conversation):
        raise ValueError("the simulator crashed")

    cancelled = []

    async def hanging(turn, conversation):
        try:
            await asyncio.Event().wait()  # never set: only the step timeout ends it
        except asyncio.CancelledError:
            cancelled.append(turn)
            raise

    samples = [Sample(prompt=prompt(i), task_name=name) for i, name in enumerate(["ok", "raise", "hang", "ok"])]
    envs = {"ok": Env(observe), "raise": Env(raising), "hang": Env(hanging)}
    result = await asyncio.wait_for(
        arollout(samples, envs, backend(renderer, lambda r: "fine"), renderer, RolloutConfig(step_timeout=2.0)),
        HANG_SECONDS,
    )
    assert cancelled == [1]  # the hung step was cancelled by its timeout, once
    ok, raised, hung, ok2 = result.trajectories
    assert ok.terminated and ok2.terminated and ok.error is None
    assert raised.error.kind == "env_error" and "the simulator crashed" in raised.error.message
    assert hung.error.kind == "env_timeout"
    assert hung.turns == 0 and hung.generated_tokens > 0  # what was generated is kept
    assert result.metrics["errors"] == {"env_error": 1, "env_timeout": 1}
    assert_faithful(result.trajectories, renderer)


class AnswersOnce(ScriptedBackend):
    """Answers the first request at once and keeps its completion; every later request never
    returns, so only a timeout ends the episode (after exactly one turn, however loaded the machine)."""

    first = None
    requests = 0

    async def generate(self, prompt_ids, params):
        self.requests += 1
        if self.first is not None:
            await asyncio.Event().wait()  # never set
        self.first = await super().generate(prompt_ids, params)
        return self.first


async def test_episode_timeout_keeps_what_was_produced(renderer):
    scripted = AnswersOnce(lambda r: "slow", renderer, end_token_id=renderer.stop_token_ids[0])
    result = await asyncio.wait_for(
        arollout(
            [Sample(prompt=prompt(0))],
            {"default": Env(observe)},
            scripted,
            renderer,
            RolloutConfig(episode_timeout=1.0, step_timeout=0.5),
        ),
        HANG_SECONDS,
    )
    t = result.trajectories[0]
    assert t.error.kind == "episode_timeout" and scripted.requests == 2  # the second generation was cut
    assert t.turns == 1 and t.generated_tokens == len(scripted.first.token_ids) >= 2
    assert [i for i, bit in zip(t.token_ids, t.loss_mask) if bit] == list(scripted.first.token_ids)


async def test_backend_failure_fails_only_that_episode(renderer):
    def script(request):
        if "Task number 1." in renderer.decode(request.prompt_ids):
            raise RuntimeError("engine lost the request")
        return "fine"

    samples = [Sample(prompt=prompt(i)) for i in range(3)]
    result = await arollout(samples, {"default": Env(observe)}, backend(renderer, script), renderer)
    assert [t.error.kind if t.error else None for t in result.trajectories] == [None, "backend_error", None]


async def test_capacity_below_concurrency_is_an_error_at_start(renderer):
    samples = [Sample(prompt=prompt(i)) for i in range(8)]
    scripted = backend(renderer, lambda r: "x")
    with pytest.raises(ConfigError, match="allows 2 concurrent sessions but the rollout needs 4"):
        await arollout(
            samples, {"default": Env(observe, max_sessions=2)}, scripted, renderer, RolloutConfig(concurrency=4)
        )
    assert scripted.calls == 0


async def test_a_session_for_overlapping_rollouts_checks_capacity_and_prepares_once(renderer):
    from rollforge.rollout.engine import open_session

    class Counted(Env):
        prepared = released = 0

        async def prepare(self, sessions):
            self.prepared += 1
            self.sessions = sessions

        async def release(self):
            self.released += 1

    with pytest.raises(ConfigError, match="allows 2 concurrent sessions but the rollout needs 4"):
        async with open_session({"default": Env(observe, max_sessions=2)}, 4):
            pass
    env = Counted(observe)
    scripted = backend(renderer, lambda r: "x")
    async with open_session({"default": env}, 4) as session:
        for first in (0, 2):  # two rollouts on the one session: no prepare or release of their own
            samples = [Sample(prompt=prompt(i)) for i in range(first, first + 2)]
            result = await arollout(samples, {"default": env}, scripted, renderer, session=session)
            assert all(t.error is None for t in result.trajectories)
        assert (env.prepared, env.sessions, env.released) == (1, 4, 0)
    assert env.released == 1


async def test_lockstep_generates_each_turn_together_async_does_not_wait(renderer):
    """Episode "xxxx" has a fast environment; the others' environments step only once it has
    finished (async) or after a number of passes of the event loop (lockstep, which would wait for
    them forever otherwise). Lockstep still generates each turn together; async lets it run ahead."""
    in_flight, peaks, turns, fast_done = [0], [], [], asyncio.Event()

    class Probe(ScriptedBackend):
        async def generate(self, prompt_ids, params):
            in_flight[0] += 1
            peaks.append(in_flight[0])
            turns.append(renderer.decode(prompt_ids).count("next"))
            try:
                return await super().generate(prompt_ids, params)
            finally:
                in_flight[0] -= 1

    async def uneven(turn, conversation):
        fast = conversation[0].content == "xxxx"
        if fast and turn == 3:
            fast_done.set()
        elif not fast:
            for _ in range(20 * len(conversation[0].content)):  # slower, in loop passes, not seconds
                await asyncio.sleep(0)
        return Step(messages=(Message("user", "next"),), terminated=turn == 3)

    async def waits_for_the_fast_one(turn, conversation):
        if conversation[0].content != "xxxx":
            await fast_done.wait()
        return await uneven(turn, conversation)

    samples = [Sample(prompt=[{"role": "user", "content": "x" * (i + 1)}]) for i in range(4)]
    for mode, env in (("lockstep", uneven), ("async", waits_for_the_fast_one)):
        peaks.clear(), turns.clear(), fast_done.clear()
        probe = Probe(lambda r: "go", renderer, end_token_id=renderer.stop_token_ids[0], latency=0.01)
        await asyncio.wait_for(
            arollout(samples, {"default": Env(env)}, probe, renderer, RolloutConfig(mode=mode)), HANG_SECONDS
        )
        if mode == "lockstep":
            assert peaks == [1, 2, 3, 4] * 3  # all four requests of every turn are in flight together
            assert turns == sorted(turns) == [0] * 4 + [1] * 4 + [2] * 4
        else:
            assert sorted(turns) == [0] * 4 + [1] * 4 + [2] * 4
            assert turns[:6] == [0, 0, 0, 0, 1, 2]  # the episode with the fast environment ran ahead


def test_config_rejects_unknown_and_bad_values():
    with pytest.raises(ConfigError, match="max_turn"):
        RolloutConfig.build(max_turn=3)
    with pytest.raises(ConfigError, match="concurrency"):
        RolloutConfig.build(concurrency=0)


async def test_concurrency_limit_and_greedy_switch_reach_the_episodes(renderer):
    open_now, peak, temperatures = [0], [0], []

    class Counting(Scripted):
        async def reset(self, sample):
            open_now[0] += 1
            peak[0] = max(peak[0], open_now[0])
            return await super().reset(sample)

        async def close(self):
            open_now[0] -= 1

    class CountingEnv(Env):
        def open(self, sample):
            return Counting(self.behave)

    def script(request):
        temperatures.append(request.params.temperature)
        return "ok"

    samples = [Sample(prompt=prompt(i)) for i in range(7)]
    result = await arollout(
        samples,
        {"default": CountingEnv(observe)},
        backend(renderer, script, latency=0.01),
        renderer,
        RolloutConfig(concurrency=2, greedy=True, temperature=0.7),
    )
    assert peak[0] == 2 and open_now[0] == 0
    assert len(temperatures) == 21 and set(temperatures) == {0.0}
    assert all(t.terminated for t in result.trajectories)


async def test_lockstep_episode_timing_out_at_the_barrier_does_not_hurt_the_others(renderer):
    def slow_for_task_one(request):
        return "answer"

    class Uneven(ScriptedBackend):
        turns_of_one = 0

        async def generate(self, prompt_ids, params):
            if "Task number 1." in renderer.decode(prompt_ids):
                self.turns_of_one += 1
                if self.turns_of_one == 2:  # episode 1's second generation never returns: the others wait for it
                    await asyncio.Event().wait()
            return await super().generate(prompt_ids, params)

    async def quick(turn, conversation):
        return Step(messages=(Message("user", "more"),), terminated=turn == 2)

    samples = [Sample(prompt=prompt(i)) for i in range(3)]
    scripted = Uneven(slow_for_task_one, renderer, end_token_id=renderer.stop_token_ids[0])
    config = RolloutConfig(mode="lockstep", episode_timeout=1.0, step_timeout=0.5)
    result = await asyncio.wait_for(
        arollout(samples, {"default": Env(quick)}, scripted, renderer, config), HANG_SECONDS
    )  # a barrier left waiting would hang here
    # Episode 1 hangs in its second generation and times out; 0 and 2 wait for it at the barrier
    # and the first of them to time out must not cancel the barrier for the rest.
    kinds = [t.error.kind if t.error else "ok" for t in result.trajectories]
    assert kinds[1] == "episode_timeout" and result.trajectories[1].turns == 1 and scripted.turns_of_one == 2
    assert all(kind in ("ok", "episode_timeout") for kind in kinds)
    assert result.metrics["episodes"] == 3


async def test_a_prompt_longer_than_max_seq_len_is_refused_before_generating(renderer):
    scripted = backend(renderer, lambda r: "never")
    long_prompt = [{"role": "user", "content": "word " * 100}]
    with pytest.raises(
        ConfigError, match=r"^max_seq_len=50 leaves no room to generate: prompt 1 is already \d+ tokens; "
    ):
        await arollout(
            [Sample(prompt=long_prompt)], {"default": Env(observe)}, scripted, renderer, RolloutConfig(max_seq_len=50)
        )
    assert scripted.calls == 0


async def test_a_tool_description_that_leaves_no_room_is_refused_before_generating(renderer):
    # `rollforge rollout --env catch --max-seq-len 400` ran "2 episodes, 0 turns, errors none": the
    # start-up check measured the prompt without the tool description the episode adds to it.
    scripted = backend(renderer, lambda r: "never")
    short = [{"role": "user", "content": "Count to five."}]
    bare = len(renderer.prompt_ids(Sample(prompt=short).prompt)) + len(renderer.generation_prompt)
    envs = {"count": FactoryEnvironment(Counter), "multi": FactoryEnvironment({"counter": Counter})}
    samples = [
        Sample(prompt=short, task_name="multi", row={"environment": "counter"}),
        Sample(prompt=short, task_name="count"),
    ]
    with pytest.raises(ConfigError) as info:
        await arollout(samples, envs, scripted, renderer, RolloutConfig(max_seq_len=bare + 20))
    assert str(info.value).startswith(f"max_seq_len={bare + 20} leaves no room to generate: prompt 1 is already ")
    assert str(info.value).endswith(
        " tokens with the description of its tools (and 1 more prompts); raise max_seq_len or shorten the prompts"
    )
    assert scripted.calls == 0


async def test_a_reset_observation_longer_than_max_seq_len_is_truncated_before_generating(renderer):
    class LongReset(Scripted):  # the observation reset adds is known only once the episode runs
        async def reset(self, sample):
            return Reset(prompt=(*sample.prompt, Message("user", "word " * 100)))

    class Verbose(Env):
        def open(self, sample):
            return LongReset(self.behave)

    scripted = backend(renderer, lambda r: "never")
    result = await arollout(
        [Sample(prompt=prompt(0))], {"default": Verbose(observe)}, scripted, renderer, RolloutConfig(max_seq_len=100)
    )
    t = result.trajectories[0]
    assert t.truncated and t.turns == 0 and len(t.token_ids) == 100 == t.prompt_length
    assert scripted.calls == 0
    assert_faithful([t], renderer)
