"""OpenAICompatBackend against small local aiohttp servers on 127.0.0.1 that misbehave on purpose:
server down, transient and permanent errors, malformed bodies, a server without token ids, a
server that never answers. Each failure is a clear ``BackendError`` for the request concerned,
bounded in time; in a rollout only the affected episodes fail.

The well-behaved answer is the reply "Hi<|im_end|>" of the tiny offline model's tokenizer.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from rollforge.backends import openai_compat
from rollforge.backends.base import Backend, SamplingParams, WeightSync
from rollforge.backends.openai_compat import OpenAICompatBackend, completion_from_response
from rollforge.backends.settings import OpenAICompatSettings
from rollforge.chat.render import ChatRenderer
from rollforge.envs.base import BaseSession, Environment, Reset, Step
from rollforge.errors import BackendError, ConfigError
from rollforge.models import load_tokenizer
from rollforge.rollout.config import RolloutConfig
from rollforge.rollout.engine import arollout
from rollforge.testing import HANG_SECONDS, RecordingBackend, assert_token_exact, free_port
from rollforge.types import Sample

web = pytest.importorskip("aiohttp.web", reason="aiohttp serves the fake servers (installed with vllm)")
pytest.importorskip("httpx", reason="needs the openai extra")

PARAMS = SamplingParams(max_new_tokens=8, seed=1)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def reply(tokenizer):
    return tokenizer.encode("Hi", add_special_tokens=False) + tokenizer.encode("<|im_end|>", add_special_tokens=False)


def ok_body(ids):
    return {
        "choices": [
            {
                "index": 0,
                "text": "",
                "token_ids": ids,
                "finish_reason": "stop",
                "logprobs": {"token_logprobs": [-0.5] * len(ids)},
            }
        ]
    }


class FakeServer:
    """An aiohttp app answering ``/v1/completions`` with ``handler(body) -> web.Response``; counts
    requests and the most that were in flight at once."""

    def __init__(self, handler):
        self.handler = handler
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0

    async def completions(self, request):
        body = await request.json()
        self.requests.append(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.handler(body)
        finally:
            self.in_flight -= 1


@pytest.fixture
async def serve():
    runners = []

    async def start(handler) -> tuple[str, FakeServer]:
        fake = FakeServer(handler)
        app = web.Application()
        app.router.add_post("/v1/completions", fake.completions)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}", fake

    yield start
    for runner in runners:
        await runner.cleanup()


def backend(url, **options) -> OpenAICompatBackend:
    options = {"max_retries": 2, "backoff": 0.01, "max_backoff": 0.05, "request_timeout": HANG_SECONDS, **options}
    return OpenAICompatBackend(url, OpenAICompatSettings(**options))


async def test_well_formed_answer_and_request_body(serve, reply):
    async def answer(body):
        return web.json_response(ok_body(reply))

    url, fake = await serve(answer)
    client = backend(url + "/v1/", model="m")
    completion = await client.generate(
        [5, 6, 7], SamplingParams(max_new_tokens=8, temperature=0.5, stop=("x",), seed=4)
    )
    await client.close()
    assert isinstance(client, Backend) and isinstance(client, WeightSync)
    assert completion.token_ids == tuple(reply) and completion.logprobs == (-0.5,) * len(reply)
    (body,) = fake.requests
    assert body["prompt"] == [5, 6, 7] and body["model"] == "m" and body["seed"] == 4
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["include_stop_str_in_output"] is True and body["skip_special_tokens"] is False
    assert (body["max_tokens"], body["temperature"], body["stop"]) == (8, 0.5, ["x"])


async def test_server_down_fails_after_bounded_retries():
    client = backend(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(BackendError, match=r"failed after 3 attempts; last: ConnectError"):
        await asyncio.wait_for(client.generate([1, 2], PARAMS), HANG_SECONDS)
    await client.close()


async def test_transient_errors_are_retried(serve, reply):
    async def flaky(body):
        if len(fake.requests) <= 2:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        return web.json_response(ok_body(reply))

    url, fake = await serve(flaky)
    client = backend(url)
    completion = await client.generate([1, 2], PARAMS)
    await client.close()
    assert completion.token_ids == tuple(reply) and len(fake.requests) == 3


async def test_persistent_server_error_gives_up_with_the_status(serve):
    async def broken(body):
        return web.Response(status=500, text="Internal Server Error")

    url, fake = await serve(broken)
    client = backend(url)
    with pytest.raises(BackendError, match=r"after 3 attempts; last: HTTP 500: Internal Server Error"):
        await client.generate([1, 2], PARAMS)
    await client.close()
    assert len(fake.requests) == 3


async def test_client_error_is_not_retried_and_names_the_servers_reason(serve):
    async def reject(body):
        return web.json_response({"error": {"message": "This model's maximum context length is 8"}}, status=400)

    url, fake = await serve(reject)
    client = backend(url)
    with pytest.raises(BackendError, match=r"HTTP 400: This model's maximum context length is 8"):
        await client.generate([1, 2], PARAMS)
    await client.close()
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    "body, reason",
    [
        ("<html>oops</html>", "not JSON: <html>oops</html>"),
        ({"choices": []}, "no choices"),
        (
            {"choices": [{"text": "hi", "finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}]},
            "return_token_ids",
        ),
        ({"choices": [{"token_ids": [3, 4], "finish_reason": "stop"}]}, "token_logprobs is missing"),
        (
            {"choices": [{"token_ids": [3, 4], "finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}]},
            "2 token ids but 1 logprobs",
        ),
        (
            {"choices": [{"token_ids": ["a"], "finish_reason": "stop", "logprobs": {"token_logprobs": [-1.0]}}]},
            "not a list of integers",
        ),
        (
            {"choices": [{"token_ids": [3], "finish_reason": "tool_calls", "logprobs": {"token_logprobs": [-1.0]}}]},
            "finish_reason 'tool_calls'",
        ),
    ],
)
async def test_malformed_responses_are_clear_errors(serve, body, reason):
    async def answer(_):
        return web.Response(text=body) if isinstance(body, str) else web.json_response(body)

    url, fake = await serve(answer)
    client = backend(url)
    with pytest.raises(BackendError) as caught:
        await client.generate([1, 2], PARAMS)
    await client.close()
    assert reason in str(caught.value)
    assert len(fake.requests) == 1  # a malformed answer is not retried


async def test_a_server_that_never_answers_times_out(serve):
    async def hang(body):
        await asyncio.Event().wait()  # never set: only the client's request timeout ends the wait

    url, fake = await serve(hang)
    client = backend(url, request_timeout=0.3)
    with pytest.raises(BackendError, match=r"no response within request_timeout=0.3 s"):
        await asyncio.wait_for(client.generate([1, 2], PARAMS), HANG_SECONDS)
    await client.close()
    assert len(fake.requests) == 1  # a request that timed out is not sent again


async def test_concurrency_is_bounded(serve, reply):
    changed = asyncio.Condition()

    async def held(body):
        """Each request waits until four were in flight together (the client's limit), then all go."""
        async with changed:
            changed.notify_all()
            await asyncio.wait_for(
                changed.wait_for(lambda: fake.max_in_flight >= 4 or len(fake.requests) == 20), HANG_SECONDS
            )
        return web.json_response(ok_body(reply))

    url, fake = await serve(held)
    client = backend(url, max_concurrency=4)
    completions = await asyncio.gather(*(client.generate([1, i + 2], PARAMS) for i in range(20)))
    await client.close()
    assert len(completions) == 20 and fake.max_in_flight == 4


async def test_weight_sync_on_a_server_without_dev_endpoints_is_a_clear_error(serve, tiny_model_dir):
    from rollforge.models import load_model

    async def answer(body):
        return web.json_response({})

    url, _ = await serve(answer)
    client = backend(url, weights_dir=None)
    with pytest.raises(BackendError, match=r"/pause does not exist.*VLLM_SERVER_DEV_MODE=1"):
        await client.update_weights(load_model(tiny_model_dir)[0])
    await client.close()


# --- in a rollout, a failure takes down only its own episode ---------------------------------------


class _Answer(BaseSession):
    async def reset(self, sample: Sample) -> Reset:
        return Reset(prompt=sample.prompt)

    async def step(self, conversation) -> Step:
        return Step(terminated=True, reward=1.0)


class _SingleTurn(Environment):
    max_sessions = None

    def open(self, sample: Sample) -> _Answer:
        return _Answer()


@pytest.mark.parametrize(
    "failure, reason",
    [
        ("error", "HTTP 500"),
        ("malformed", "not JSON"),
        ("hang", "request_timeout"),
        ("no_ids", "return_token_ids"),
    ],
)
async def test_only_the_affected_episodes_fail(serve, tokenizer, reply, failure, reason):
    marker = tokenizer.encode(" zebra", add_special_tokens=False)

    async def answer(body):
        prompt = body["prompt"]
        if not any(prompt[i : i + len(marker)] == marker for i in range(len(prompt))):
            return web.json_response(ok_body(reply))
        if failure == "error":
            return web.Response(status=500, text="engine crashed")
        if failure == "malformed":
            return web.Response(text="{truncated")
        if failure == "no_ids":
            return web.json_response({"choices": [{"text": "Hi", "finish_reason": "stop"}]})
        await asyncio.Event().wait()  # never answers: the request timeout fails the episode

    url, _ = await serve(answer)
    renderer = ChatRenderer(tokenizer)
    samples = [
        Sample(prompt=[{"role": "user", "content": "Tell me about the zebra." if i in (1, 4) else f"Question {i}."}])
        for i in range(6)
    ]
    # the timeout ends the hung requests; the healthy ones, answered at once, need far less even on a loaded machine
    recording = RecordingBackend(backend(url, request_timeout=2.0))
    result = await asyncio.wait_for(
        arollout(samples, {"default": _SingleTurn()}, recording, renderer, RolloutConfig(max_turns=1)), HANG_SECONDS
    )
    await recording.inner.close()
    failed = [t for t in result.trajectories if t.error is not None]
    assert [t.index for t in failed] == [1, 4]
    assert all(t.error.kind == "backend_error" and reason in t.error.message for t in failed)
    fine = [t for t in result.trajectories if t.error is None]
    assert all(t.terminated and t.total_reward == 1.0 for t in fine)
    assert assert_token_exact(fine, recording.calls, renderer) == 4


def test_completion_parsing_accepts_what_vllm_sends():
    body = {
        "choices": [
            {
                "index": 0,
                "text": "Hi",
                "token_ids": [10, 2],
                "finish_reason": "length",
                "logprobs": {"tokens": ["Hi", "!"], "token_logprobs": [-0.25, -1], "top_logprobs": None},
            }
        ]
    }
    completion = completion_from_response(body)
    assert (completion.token_ids, completion.logprobs, completion.finish_reason) == ((10, 2), (-0.25, -1.0), "length")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base_url": "127.0.0.1:8000"}, r"an http\(s\) URL such as .*, got '127.0.0.1:8000'"),
        ({"base_url": "http://x", "max_concurrency": 0}, "max_concurrency must be >= 1, got 0"),
        ({"base_url": "http://x", "request_timeout": 0}, "request_timeout must be > 0 seconds, got 0"),
        ({"base_url": "http://x", "max_retries": -1}, "max_retries must be >= 0, got -1"),
    ],
)
def test_bad_options_name_the_value(kwargs, message):
    options = {name: value for name, value in kwargs.items() if name != "base_url"}
    with pytest.raises(ConfigError, match=message):
        OpenAICompatBackend(kwargs["base_url"], OpenAICompatSettings(**options))


async def test_weight_sync_choreography_and_stale_policy_detection(tiny_model_dir, reply, tmp_path, monkeypatch):
    """Against a fake dev-mode server: the calls update_weights makes, in order; the weights file
    exists when the server is told to load it; concurrent requests share one version check; a
    version changed behind the trainer's back fails requests with a clear reason."""
    from safetensors.torch import load_file

    from rollforge.models import load_model

    calls: list[str] = []
    state = {"version": None, "loaded": None}

    async def admin(request):
        calls.append(request.path)
        if request.path == "/collective_rpc":
            body = await request.json()
            assert body["method"] == "rollforge_reload_weights"
            state["loaded"] = set(load_file(body["kwargs"]["weights_path"] + "/model.safetensors"))
        if request.path == "/update_weight_version":
            state["version"] = (await request.json())["new_version"]
        return web.json_response({})

    async def weight_info(request):
        calls.append(request.path)
        return web.json_response({"weight_version": state["version"]})

    async def completions(request):
        calls.append(request.path)
        return web.json_response(ok_body(reply))

    app = web.Application()
    for path in ("/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"):
        app.router.add_post(path, admin)
    app.router.add_get("/weight_info", weight_info)
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    now = [1000.0]  # the client's clock, moved by the test: no waiting for an interval to pass
    monkeypatch.setattr(openai_compat, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    client = backend(f"http://127.0.0.1:{port}", weights_dir=tmp_path, version_check_interval=60)
    model = load_model(tiny_model_dir)[0]
    try:
        await client.update_weights(model)
        assert calls == [
            "/pause",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/resume",
            "/weight_info",
        ]
        assert state["loaded"] == {name for name, _ in model.named_parameters()}
        assert client.weight_version == 1 and state["version"].endswith("-1")
        assert list(tmp_path.iterdir()) == []  # the exported weights are removed once loaded

        calls.clear()
        await asyncio.gather(*(client.generate([1, 2], PARAMS) for _ in range(5)))
        assert calls.count("/weight_info") == 0  # checked during the sync, less than 60 s ago

        now[0] += 61  # the check interval passes on the client's clock
        calls.clear()
        await asyncio.gather(*(client.generate([1, 2], PARAMS) for _ in range(5)))
        assert calls.count("/weight_info") == 1  # five requests, one shared check

        state["version"] = "someone-else"
        now[0] += 61
        with pytest.raises(BackendError, match=r"stale policy: .* serves weight version 'someone-else'"):
            await client.generate([1, 2], PARAMS)
    finally:
        await client.close()
        await runner.cleanup()
