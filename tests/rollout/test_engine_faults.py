"""Fault injection against the engine: hung sync tools, bad rewards, a failing ``on_episode``
callback, pathological replies, hung or lying backends, and rollforge's own bugs.

Every case is bounded (step timeouts of a second or two, ``timeout`` around subprocesses, hang
bounds of ``HANG_SECONDS`` on waits) and runs on loopback only. No case times itself: each asserts
how its episodes ended and what was cancelled, counted."""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
import sys
import textwrap
import threading

import pytest
from transformers import AutoTokenizer

from rollforge.backends.base import Backend
from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.envs import factory
from rollforge.envs.factory import FactoryEnvironment
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.rollout.context import PARSE_INLINE_CHARS
from rollforge.rollout.metrics import rollout_metrics
from rollforge.testing import HANG_SECONDS, wait_until
from rollforge.types import Completion, Message, Sample
from rollforge.workers import ENVIRONMENT_WORKERS

PROBE = '<tool_call>\n{"name": "probe", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def backend(renderer, script, **kwargs):
    return ScriptedBackend(script, renderer, end_token_id=renderer.stop_token_ids[0], **kwargs)


def probe_then_answer(renderer):
    """Calls the probe tool once, then answers."""

    def script(request) -> str:
        return "done" if "pong" in renderer.decode(request.prompt_ids[-30:]) else PROBE

    return script


RELEASE = threading.Event()  # set at the end of the test that hangs, so its threads finish
RETURNED: list[int] = []  # hung probes that returned once released


class Hangs:
    def reset(self, **kwargs) -> None:
        return None

    def probe(self) -> str:
        """Hang like a tool waiting on a dead socket."""
        RELEASE.wait()
        RETURNED.append(1)
        return "pong"


class Answers:
    def reset(self, **kwargs) -> None:
        return None

    def probe(self) -> str:
        """Answer at once."""
        return "pong"


def rows(n_hang: int, n_ok: int) -> list[Sample]:
    names = ["hang"] * n_hang + ["ok"] * n_ok
    return [
        Sample(prompt=[{"role": "user", "content": f"Task {i}."}], row={"environment": name})
        for i, name in enumerate(names)
    ]


async def test_fifty_hung_sync_tools_do_not_stall_fifty_healthy_episodes(renderer):
    env = FactoryEnvironment({"hang": Hangs, "ok": Answers})
    # A healthy step needs far less than the step timeout, even on a loaded machine: one that waited
    # behind a hung tool for a thread would time out too.
    config = RolloutConfig(step_timeout=2.0, concurrency=100)
    try:
        result = await arollout(
            rows(50, 50), {"default": env}, backend(renderer, probe_then_answer(renderer)), renderer, config
        )
        hung, healthy = result.trajectories[:50], result.trajectories[50:]
        assert [t.error.kind for t in hung] == ["env_timeout"] * 50
        assert all(t.error is None and t.terminated and t.turns == 2 for t in healthy)
        assert result.metrics["abandoned_worker_calls"] >= 50 and ENVIRONMENT_WORKERS.abandoned >= 50
        # the stuck threads, all still hung, do not starve the next rollout of the process
        again = await arollout(
            rows(0, 40), {"default": env}, backend(renderer, probe_then_answer(renderer)), renderer, config
        )
        assert all(t.error is None and t.terminated and t.turns == 2 for t in again.trajectories)
        assert RETURNED == []
    finally:
        RELEASE.set()
    # released, the abandoned calls finish on their own threads
    assert await asyncio.to_thread(wait_until, lambda: len(RETURNED) == 50)


def test_a_program_whose_tools_hang_forever_still_exits(tiny_model_dir, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(f"""
        import threading
        from transformers import AutoTokenizer
        from rollforge.backends.scripted import ScriptedBackend
        from rollforge.chat.render import ChatRenderer
        from rollforge.envs.factory import FactoryEnvironment
        from rollforge.rollout.config import RolloutConfig
        from rollforge.rollout.engine import rollout
        from rollforge.types import Sample

        class Hangs:
            def reset(self, **kwargs):
                return None
            def probe(self) -> str:
                \"\"\"Never returns.\"\"\"
                threading.Event().wait()

        renderer = ChatRenderer(AutoTokenizer.from_pretrained({str(tiny_model_dir)!r}))
        probe = {PROBE!r}
        backend = ScriptedBackend(lambda r: probe, renderer, end_token_id=renderer.stop_token_ids[0])
        samples = [Sample(prompt=[{{"role": "user", "content": "go"}}]) for _ in range(20)]
        result = rollout(samples, {{"default": FactoryEnvironment(Hangs)}}, backend, renderer,
                         RolloutConfig(step_timeout=0.5))
        print("rollout", result.metrics["errors"], flush=True)
    """)
    )
    # Joining a hung thread would take forever: `timeout` ends such a run with 124. The bound only
    # catches that hang (imports take a few seconds on a shared machine; the exit waits out the
    # worker pool's exit grace for the hung calls).
    done = subprocess.run(["timeout", "120", sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines()[-1] == "rollout {'env_timeout': 20}", done.stdout


class Rewarding:
    """``get_reward`` returns the row's ``reward`` column: NaN and infinities included."""

    def reset(self, reward: float) -> None:
        self.reward = reward

    def get_reward(self) -> float:
        return self.reward


async def test_a_non_finite_reward_fails_its_episode_and_the_rest_stand(renderer):
    values = [1.0, math.nan, 0.5, math.inf, -math.inf, 0.25]
    samples = [Sample(prompt=[{"role": "user", "content": "hi"}], row={"reward": v}) for v in values]
    result = await arollout(
        samples, {"default": FactoryEnvironment(Rewarding)}, backend(renderer, lambda r: "ok"), renderer
    )
    kinds = [t.error.kind if t.error else None for t in result.trajectories]
    assert kinds == [None, "env_error", None, "env_error", "env_error", None]
    assert [t.total_reward for t in result.trajectories if t.error is None] == [1.0, 0.5, 0.25]
    assert "get_reward() must return a finite number, got nan" in result.trajectories[1].error.message
    # failed episodes (env_error: infrastructure) have no known reward: left out, as training does
    assert result.metrics["mean_total_reward"] == pytest.approx(1.75 / 3) and result.metrics["rewarded_episodes"] == 3


class NanStep(BaseSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        return Step(reward=float("nan"), terminated=True)


class NanSteps(Environment):
    def open(self, sample):
        return NanStep()


async def test_a_step_with_a_nan_reward_is_an_environment_error(renderer):
    result = await arollout(
        [Sample(prompt=[{"role": "user", "content": "hi"}])],
        {"default": NanSteps()},
        backend(renderer, lambda r: "ok"),
        renderer,
    )
    (t,) = result.trajectories
    assert t.error.kind == "env_error" and "Step.reward must be a finite number, got float nan" in t.error.message
    assert t.generated_tokens > 0  # the generated reply is kept


async def test_a_raising_on_episode_callback_is_reported_and_the_rollout_returns_everything(renderer, caplog):
    seen = []

    def on_episode(trajectory):
        seen.append(trajectory.index)
        if trajectory.index % 3 == 0:
            raise OSError(28, "No space left on device")

    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(7)]
    with caplog.at_level(logging.WARNING, logger="rollforge.rollout.engine"):
        result = await arollout(
            samples,
            {"default": FactoryEnvironment(Answers)},
            backend(renderer, lambda r: "ok"),
            renderer,
            on_episode=on_episode,
        )
    assert sorted(seen) == list(range(7)) and len(result.trajectories) == 7
    assert result.metrics["on_episode_errors"] == 3  # episodes 0, 3 and 6
    assert sum("No space left on device" in r.getMessage() for r in caplog.records) == 3


async def test_a_110_kb_reply_of_repeated_tool_call_tags_is_parsed_while_the_loop_runs(renderer, monkeypatch):
    """However long or pathological a reply, its parse cannot hold the event loop (a quadratic
    parse on the loop once held it 16 s): each long parse waits until the loop has run a callback,
    which it can only do when the parse runs on another thread."""
    reply = "<tool_call>" * 10_000  # 110,000 characters
    ids = tuple(renderer.encode(reply)) + (renderer.stop_token_ids[0],)

    class Replies(Backend):  # a real backend samples on its own thread: only the engine's work is on the loop
        async def generate(self, prompt_ids, params):
            return Completion(ids, (-0.5,) * len(ids), "stop")

    loop, parser = asyncio.get_running_loop(), type(renderer.parser(None))
    parse, loop_ran = parser.parse, []  # per long parse: whether the loop ran while it was under way

    def parse_while_the_loop_runs(self, text):
        if len(text) > PARSE_INLINE_CHARS:
            answered = threading.Event()
            loop.call_soon_threadsafe(answered.set)
            loop_ran.append(answered.wait(HANG_SECONDS))
        return parse(self, text)

    monkeypatch.setattr(parser, "parse", parse_while_the_loop_runs)
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(3)]
    config = RolloutConfig(max_turns=1, max_new_tokens=200_000, max_seq_len=400_000, check_template=False)
    result = await arollout(samples, {"default": FactoryEnvironment(Answers)}, Replies(), renderer, config)
    assert loop_ran == [True, True, True]
    assert all(len(t.messages[-2].content) == 110_000 for t in result.trajectories)
    assert all(t.failures and t.failures[0].kind == "tool_invalid_json" for t in result.trajectories)


class WrongIds(ScriptedBackend):
    async def generate(self, prompt_ids, params):
        return Completion((5, 10**9), (-0.1, -0.2), "stop")


async def test_a_token_id_outside_the_vocabulary_is_a_backend_error(renderer):
    result = await arollout(
        [Sample(prompt=[{"role": "user", "content": "hi"}])],
        {"default": FactoryEnvironment(Answers)},
        WrongIds(lambda r: "", renderer),
        renderer,
    )
    (t,) = result.trajectories
    assert t.error.kind == "backend_error"
    assert (
        t.error.message
        == f"the backend returned token id {10**9}, outside the vocabulary of {len(renderer.tokenizer)} tokens"
    )


class Hanging(ScriptedBackend):
    """A request that never answers; counts the requests the engine cancelled."""

    cancelled = 0

    async def generate(self, prompt_ids, params):
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def test_a_hung_backend_request_is_bounded_by_the_request_timeout(renderer):
    assert RolloutConfig().request_timeout == 600 and RolloutConfig().episode_timeout == 1800  # bounded defaults
    hanging = Hanging(lambda r: "", renderer)
    result = await asyncio.wait_for(  # the bound only catches a hang: the request timeout must end it
        arollout(
            [Sample(prompt=[{"role": "user", "content": "hi"}])],
            {"default": FactoryEnvironment(Answers)},
            hanging,
            renderer,
            RolloutConfig(request_timeout=0.3),
        ),
        HANG_SECONDS,
    )
    assert hanging.cancelled == 1
    (t,) = result.trajectories
    assert t.error.kind == "backend_error" and t.error.message == "generation exceeded the request timeout of 0.3s"


class BadMessage(BaseSession):
    async def reset(self, sample):
        return Reset(prompt=sample.prompt)

    async def step(self, conversation):
        return Step(messages=(Message("user", 42),))  # content must be str: rollforge's InvariantError


class BadMessages(Environment):
    def open(self, sample):
        return BadMessage()


async def test_an_invalid_value_built_by_the_users_session_is_an_env_error_not_a_crash(renderer):
    samples = [Sample(prompt=[{"role": "user", "content": "hi"}])] * 2
    result = await arollout(samples, {"default": BadMessages()}, backend(renderer, lambda r: "ok"), renderer)
    assert [t.error.kind for t in result.trajectories] == ["env_error", "env_error"]
    assert "InvariantError: message content must be str, got int" in result.trajectories[0].error.message


class TypoInUserCode:
    def reset(self, **kwargs) -> None:
        return None

    def get_reward(self) -> float:
        return len(5)  # the user's own TypeError


async def test_a_users_type_error_is_an_env_error_but_a_rollforge_bug_propagates(renderer, monkeypatch):
    result = await arollout(
        [Sample(prompt=[{"role": "user", "content": "hi"}])],
        {"default": FactoryEnvironment(TypoInUserCode)},
        backend(renderer, lambda r: "ok"),
        renderer,
    )
    (t,) = result.trajectories
    assert t.error.kind == "env_error" and "TypeError: object of type 'int' has no len()" in t.error.message

    # an AttributeError raised by rollforge's own code inside the environment boundary (rendering a
    # tool result) is a bug: it is not filed as env_error, it stops the rollout
    monkeypatch.setattr(factory, "_render_result", rollout_metrics)  # handed a tool result, not trajectories
    samples = [Sample(prompt=[{"role": "user", "content": f"Task {i}."}]) for i in range(5)]
    with pytest.raises(AttributeError, match="'str' object has no attribute 'turns'"):
        await arollout(
            samples, {"default": FactoryEnvironment(Answers)}, backend(renderer, probe_then_answer(renderer)), renderer
        )


class DuckEnvironment:  # has open() but does not declare the contract's hooks
    def open(self, sample):
        return NanStep()


async def test_objects_that_are_not_environments_or_backends_are_refused_in_one_line(renderer):
    from rollforge.errors import ConfigError

    samples = [Sample(prompt=[{"role": "user", "content": "hi"}])]
    with pytest.raises(
        ConfigError,
        match=r"^the environment for task 'default' is a DuckEnvironment, not a rollforge "
        r"Environment; .* subclass rollforge.envs.base.Environment$",
    ):
        await arollout(samples, {"default": DuckEnvironment()}, backend(renderer, lambda r: "ok"), renderer)

    class DuckBackend:
        async def generate(self, prompt_ids, params):
            raise AssertionError("never called")

    with pytest.raises(ConfigError, match=r"^the backend is a DuckBackend, not a rollforge Backend"):
        await arollout(samples, {"default": NanSteps()}, DuckBackend(), renderer)
