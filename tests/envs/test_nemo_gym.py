"""NeMo Gym resources servers over HTTP (``envs/adapters/nemo_gym.py``), rollforge playing the agent.

The servers are aiohttp apps on 127.0.0.1 in the test's own loop, speaking NeMo Gym's documented
routes with its shapes: a ``SimpleResourcesServer`` like ``example_multi_step`` (``/seed_session``
setting a session cookie, one route per tool answering 422 to a bad body, ``/verify`` reading the
Responses-shaped ``response``) and a ``GymnasiumServer`` (``/reset``, ``/step`` with
``info.tool_outputs``, ``/close``). Rows have the shape of NeMo Gym's example datasets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid

import pytest
from aiohttp import web
from transformers import AutoTokenizer

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.cli.main import main
from rollforge.envs.adapters import nemo_gym
from rollforge.envs.adapters.nemo_gym import NemoGymEnvironment
from rollforge.envs.check import acheck_env
from rollforge.envs.library import get_env_spec
from rollforge.errors import ConfigError
from rollforge.inputs.data import rows_to_samples
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.types import Sample

SYSTEM = "Find the synonyms of the term and extract their values, in order."


def _tool(name: str, properties: dict, required: list[str]) -> dict:
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {
        "type": "function",
        "name": name,
        "description": f"The {name} tool.",
        "parameters": parameters,
        "strict": True,
    }


TOOLS = [
    _tool("get_synonym_value", {"synonym": {"type": "string"}}, ["synonym"]),
    _tool(
        "extract_synonym_values",
        {"synonym_values": {"type": "array", "items": {"type": "integer"}}},
        ["synonym_values"],
    ),
]


def row(**extra) -> dict:
    """A row shaped like example_multi_step's dataset."""
    params = {
        "input": [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": "I'm very warm"}],
        "tools": TOOLS,
        "parallel_tool_calls": False,
    }
    return {"responses_create_params": params, "expected_synonym_values": [sum(map(ord, "Blazing"))], **extra}


def resources_app(log: list) -> web.Application:
    """A SimpleResourcesServer: state per session cookie, as NeMo Gym's session middleware keeps it."""
    sessions: dict[str, list[str]] = {}

    async def seed_session(request: web.Request) -> web.Response:
        log.append(("seed_session", await request.json()))
        sid = uuid.uuid4().hex
        sessions[sid] = []
        response = web.json_response({})
        response.set_cookie("session", sid)
        return response

    def tool(name: str, field: str, valid, compute):
        async def handler(request: web.Request) -> web.Response:
            calls = sessions[request.cookies["session"]]  # a call outside a seeded session fails loudly
            body = await request.json()
            if field not in body or not valid(body[field]):  # as the route's pydantic body model answers
                detail = "Field required" if field not in body else "Input should be valid"
                return web.json_response({"detail": [{"loc": ["body", field], "msg": detail}]}, status=422)
            calls.append(name)
            return web.json_response(compute(body[field]))

        return handler

    async def verify(request: web.Request) -> web.Response:
        body = await request.json()
        log.append(("verify", body))
        calls = [
            o
            for o in body["response"]["output"]
            if o["type"] == "function_call" and o["name"] == "extract_synonym_values"
        ]
        actual = json.loads(calls[-1]["arguments"])["synonym_values"] if calls else []
        verdict = {
            **body,
            "reward": float(actual == body["expected_synonym_values"]),
            "tool_calls_seen": sessions[request.cookies["session"]],
        }
        if body.get("judge") == "down":
            verdict.update(mask_sample=True, failure_kind="judge_failed", failure_reason="the judge did not answer")
        if body.get("judge") == "slow":
            verdict.update(mask_sample=True, failure_kind="transport_timeout", failure_reason="judge timed out")
        if body.get("judge") == "degraded":
            verdict.update(failure_kind="judge_unparseable", failure_reason="fell back to exact match")
        return web.json_response(verdict)

    app = web.Application()
    app.router.add_post("/seed_session", seed_session)
    app.router.add_post(
        "/get_synonym_value",
        tool(
            "get_synonym_value", "synonym", lambda s: isinstance(s, str), lambda s: {"synonym_value": sum(map(ord, s))}
        ),
    )
    app.router.add_post(
        "/extract_synonym_values",
        tool(
            "extract_synonym_values",
            "synonym_values",
            lambda v: isinstance(v, list) and all(type(x) is int for x in v),
            lambda v: {"success": True},
        ),
    )
    app.router.add_post("/verify", verify)
    return app


def gymnasium_app(log: list) -> web.Application:
    """A GymnasiumServer: guess the secret (the row's ``secret``) with the ``guess`` tool, within the
    row's ``max_steps`` if it has one (then ``truncated``)."""
    state: dict[str, int] = {}
    steps: dict[str, tuple[int, int | None]] = {}  # session -> (steps taken, the limit)

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(
            {"openapi": "3.1.0", "paths": {p: {"post": {}} for p in ("/reset", "/step", "/aggregate_metrics")}}
        )

    async def reset(request: web.Request) -> web.Response:
        body = await request.json()
        sid = uuid.uuid4().hex
        state[sid], steps[sid] = body["secret"], (0, body.get("max_steps"))
        response = web.json_response(
            {"observation": "Guess a number from 1 to 3.", "info": {"supports_explicit_close": True}}
        )
        response.set_cookie("session", sid)
        return response

    async def step(request: web.Request) -> web.Response:
        body = await request.json()
        sid = request.cookies["session"]
        secret, (taken, limit) = state[sid], steps[sid]
        steps[sid] = (taken + 1, limit)
        log.append(("step", body["response"]["output"]))
        outputs, reward = [], 0.0
        for item in body["response"]["output"]:
            if item["type"] == "function_call" and item["name"] == "guess":
                n = json.loads(item["arguments"])["n"]
                reward = float(n == secret)
                outputs.append(
                    {"call_id": item["call_id"], "output": json.dumps("correct" if n == secret else "wrong")}
                )
        done = reward == 1.0
        observation = None if done or outputs else "Use the guess tool."
        truncated = not done and limit is not None and taken + 1 >= limit
        return web.json_response(
            {
                "observation": observation,
                "reward": reward,
                "terminated": done,
                "truncated": truncated,
                "info": {"tool_outputs": outputs},
            }
        )

    async def close(request: web.Request) -> web.Response:
        log.append(("close", request.cookies.get("session") in state))
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/openapi.json", openapi)
    for path, handler in (("/reset", reset), ("/step", step), ("/close", close)):
        app.router.add_post(path, handler)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def policy(renderer, replies: list[str]) -> ScriptedBackend:
    """The ``n``-th request of the episode gets ``replies[n]``."""
    return ScriptedBackend(lambda request: replies[request.call], renderer, end_token_id=renderer.stop_token_ids[0])


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


BLAZING = sum(map(ord, "Blazing"))
SOLVE = [
    call("get_synonym_value", synonym="Blazing"),
    call("extract_synonym_values", synonym_values=[BLAZING]),
    "Done.",
]
CONFIG = RolloutConfig(max_turns=6, concurrency=1, max_new_tokens=200)


async def run(url: str, rows: list[dict], renderer, replies: list[str]):
    name = f"nemogym:{url}"
    environment = get_env_spec(name).build()  # as `--env nemogym:URL` builds it
    samples = rows_to_samples(rows, [name])  # as `--data` reads NeMo Gym's JSONL rows
    result = await arollout(samples, {name: environment}, policy(renderer, replies), renderer, CONFIG)
    return result.trajectories[0]


async def test_tool_round_trip_and_verify_reward(renderer):
    log: list = []
    async with serving(resources_app(log)) as url:
        trajectory = await run(url, [row(extra_column=7)], renderer, SOLVE)
    assert trajectory.error is None and trajectory.terminated
    assert trajectory.total_reward == 1.0 and trajectory.rewards[-1] == 1.0
    system, user = trajectory.messages[:2]
    assert system.role == "system" and SYSTEM in system.content and user.content == "I'm very warm"
    tools = [m for m in trajectory.messages if m.role == "tool"]
    assert [json.loads(m.content) for m in tools] == [{"synonym_value": BLAZING}, {"success": True}]
    assert trajectory.metadata["tool_calls_seen"] == [
        "get_synonym_value",
        "extract_synonym_values",
    ]  # one cookie session
    assert log[0] == ("seed_session", row(extra_column=7))  # the whole row, every column
    verify = log[-1][1]
    assert verify["expected_synonym_values"] == [BLAZING] and verify["extra_column"] == 7
    output = verify["response"]["output"]
    assert [o["type"] for o in output] == ["function_call", "function_call_output"] * 2 + ["message"]
    assert output[0]["call_id"] == output[1]["call_id"] and output[-1]["content"][0]["text"] == "Done."
    assert token_fidelity_gap(trajectory, renderer) is None


async def test_bad_arguments_and_unknown_tools_are_counted_and_the_episode_goes_on(renderer):
    replies = [call("get_synonym_value", word="Blazing") + call("verify", answer=1), *SOLVE]
    async with serving(resources_app([])) as url:
        trajectory = await run(url, [row()], renderer, replies)
    assert trajectory.error is None and trajectory.total_reward == 1.0
    first_results = [m for m in trajectory.messages if m.role == "tool"][:2]
    assert "Field required" in first_results[0].content and "unknown tool 'verify'" in first_results[1].content
    assert [f.kind for f in trajectory.failures] == ["tool_bad_arguments", "tool_unknown"]  # 'verify' never posted


@pytest.mark.parametrize(("judge", "kind"), [("down", "env_error"), ("slow", "env_timeout")])
async def test_mask_sample_fails_the_episode_as_infrastructure(renderer, judge, kind):
    async with serving(resources_app([])) as url:
        trajectory = await run(url, [row(judge=judge)], renderer, SOLVE)
    assert trajectory.error is not None and trajectory.error.kind == kind
    assert trajectory.outcome == "infra_failure" and "NeMo Gym masked the sample" in trajectory.error.message


async def test_unmasked_failure_kind_keeps_the_reward(renderer):
    async with serving(resources_app([])) as url:
        trajectory = await run(url, [row(judge="degraded")], renderer, SOLVE)
    assert trajectory.error is None and trajectory.total_reward == 1.0
    assert trajectory.metadata["failure_kind"] == "judge_unparseable"


async def test_gymnasium_reset_step_protocol(renderer):
    log: list = []
    params = {
        "input": [{"role": "user", "content": "Play."}],
        "tools": [_tool("guess", {"n": {"type": "integer"}}, ["n"])],
    }
    async with serving(gymnasium_app(log)) as url:
        trajectory = await run(
            url,
            [{"responses_create_params": params, "secret": 2}],
            renderer,
            [call("guess", n="two"), call("guess", n=1), call("guess", n=2)],
        )
    assert trajectory.error is None and trajectory.terminated
    assert trajectory.rewards == (0.0, 0.0, 1.0)
    assert [f.kind for f in trajectory.failures] == ["tool_bad_arguments"]
    users = [m.content for m in trajectory.messages if m.role == "user"]
    # /reset's observation, then /step's to the turn whose only call was left out: user messages
    assert users == ["Play.", "Guess a number from 1 to 3.", "Use the guess tool."]
    tool_results = [m.content for m in trajectory.messages if m.role == "tool"]
    assert tool_results == ["Error: guess: argument 'n' must be of type integer, got \"two\"", '"wrong"', '"correct"']
    steps = [entry[1] for entry in log if entry[0] == "step"]
    assert [[o["type"] for o in output] for output in steps] == [
        [],
        ["function_call"],
        ["function_call"],
    ]  # this turn's only
    assert log[-1] == ("close", True)
    assert token_fidelity_gap(trajectory, renderer) is None


async def test_gymnasium_truncated_passes_through(renderer):
    params = {
        "input": [{"role": "user", "content": "Play."}],
        "tools": [_tool("guess", {"n": {"type": "integer"}}, ["n"])],
    }
    async with serving(gymnasium_app([])) as url:
        trajectory = await run(
            url,
            [{"responses_create_params": params, "secret": 3, "max_steps": 2}],
            renderer,
            [call("guess", n=1), call("guess", n=2), call("guess", n=3)],
        )
    assert trajectory.ending == "truncated" and trajectory.turns == 2 and trajectory.total_reward == 0.0
    assert trajectory.metadata["truncated"] is True and trajectory.metadata["terminated"] is False


async def test_unreachable_server_is_one_clear_line(renderer):
    async with serving(web.Application()) as url:
        pass  # the port is closed again
    with pytest.raises(ConfigError) as caught:
        await run(url, [row()], renderer, SOLVE)
    message = str(caught.value)
    assert "\n" not in message and f"cannot reach the NeMo Gym server at {url}" in message
    with pytest.raises(ConfigError, match="cannot reach the NeMo Gym server"):  # a named protocol is probed too
        await NemoGymEnvironment(url, protocol="resources").prepare(1)


async def test_verify_sees_the_last_tool_results_when_max_turns_ends_the_episode(renderer):
    log: list = []
    async with serving(resources_app(log)) as url:
        samples = [nemo_gym.sample(row(), "synonyms")]
        config = RolloutConfig(max_turns=1, concurrency=1, max_new_tokens=200)
        result = await arollout(
            samples, {"synonyms": NemoGymEnvironment(url)}, policy(renderer, SOLVE[:1]), renderer, config
        )
    assert result.trajectories[0].error is None and result.trajectories[0].turns == 1
    output = log[-1][1]["response"]["output"]
    assert [o["type"] for o in output] == ["function_call", "function_call_output"]
    assert json.loads(output[1]["output"]) == {"synonym_value": BLAZING}


async def test_check_env_passes():
    async with serving(resources_app([])) as url:
        report = await acheck_env(
            NemoGymEnvironment(url), samples=[nemo_gym.sample(row()), nemo_gym.sample(row(judge="degraded"))]
        )
    assert report is not None
    params = {"input": "Play.", "tools": [_tool("guess", {"n": {"type": "integer"}}, ["n"])]}
    async with serving(gymnasium_app([])) as url:
        report = await acheck_env(
            NemoGymEnvironment(url), samples=[nemo_gym.sample({"responses_create_params": params, "secret": 2})]
        )
    assert report is not None


@contextlib.contextmanager
def serving_in_a_thread(app: web.Application):
    """``serving`` for code that runs its own event loop (the CLI)."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def test_cli_rollout_on_the_dataset_rows_and_an_unreachable_server(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (row(), row(judge="degraded"))))
    log: list = []
    with serving_in_a_thread(resources_app(log)) as url:
        argv = [
            "rollout",
            "--model",
            str(tiny_model_dir),
            "--env",
            f"nemogym:{url}",
            "--data",
            str(data),
            "--max-new-tokens",
            "8",
            "--max-turns",
            "2",
            "--greedy",
        ]
        assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["error"] is None for r in records)
    assert [entry[0] for entry in log].count("verify") == 2  # the random model's replies were verified
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "again")]) == 2  # the server is gone
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("rollforge: error:")]
    assert len(errors) == 1 and f"cannot reach the NeMo Gym server at {url}" in errors[0] and "Traceback" not in err, (
        err
    )


def test_names_and_rows_are_checked_up_front():
    with pytest.raises(ConfigError, match="must be an http"):
        get_env_spec("nemogym:localhost:8000")
    with pytest.raises(ConfigError, match="no prompt generator; give the server's dataset rows with --data"):
        get_env_spec("nemogym:http://127.0.0.1:1").samples(2, 0)
    with pytest.raises(ConfigError, match="needs a 'responses_create_params' object"):
        NemoGymEnvironment("http://127.0.0.1:1").offered_tools(Sample(prompt=[{"role": "user", "content": "x"}]))
    assert nemo_gym.sample(row()).prompt[0].role == "system"  # developer -> system
