"""Gateway overhead: agents through the OpenAI SDK and the gateway vs the same requests sent to the
backend directly.

``sessions`` agents run at once, each a tool loop of ``turns`` requests against its own gateway
session: every request carries the whole conversation so far, the gateway parses and compares it,
renders only the new messages through the real chat template, generates, parses the tool call and
answers in OpenAI's format. The agents run in a process of their own (as agent programs do) and
post JSON with a plain HTTP client (aiohttp), or with ``client="openai"`` the real ``openai`` SDK
(whose own request preparation, a few ms per request growing with the conversation, is the
agent's cost with any OpenAI-compatible server). The backend is
the scripted one with a fixed latency per request (a stand-in for a served model), recorded as it
goes. The direct run then replays exactly those prompts (same ids, same params) on the same backend
with the same shape: ``sessions`` sequences of ``turns`` requests, all at once. The ratio of the
two wall times is the gateway's overhead; ``overhead_ms_per_request`` is the difference per
sequential request; ``gateway_cpu_ms_per_request`` is the CPU time of the gateway's process (HTTP,
parsing, rendering, recording, the scripted backend) per request, beside the direct run's.
Each session's record is checked token-exact against the template's rendering.

``api="responses"``: the agents speak the Responses API (``POST /v1/responses``, as openai-agents'
default model and codex-style harnesses do), sending their whole conversation as ``input`` items
(messages, ``function_call``, ``function_call_output``) each turn; the gateway translates them onto
chat completions and records them the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from ..backends.scripted import ScriptedBackend
from ..chat.render import ChatRenderer
from ..chat.toolcalls import get_parser
from ..errors import ConfigError
from ..testing import RecordingBackend, Request, renders_its_messages, tokenizer_or_tiny

NOTE_TOOL = {
    "type": "function",
    "function": {
        "name": "note",
        "description": "Write one note.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
}


def _reply(request) -> str:
    return f'<tool_call>\n{{"name": "note", "arguments": {{"text": "note {request.call % 8}"}}}}\n</tool_call>'


#: The agents' API: its route under the base URL.
ROUTES = {"chat": "chat/completions", "responses": "responses"}


def run(
    sessions: int = 64,
    turns: int = 8,
    latency: float = 0.5,
    client: str = "http",
    tokenizer_dir: str | None = None,
    api: str = "chat",
) -> dict[str, Any]:
    if api not in ROUTES:
        raise ConfigError(f"--api must be one of {', '.join(ROUTES)}, got {api!r}")
    return asyncio.run(_run(sessions, turns, latency, client, tokenizer_dir, api))


async def _run(
    sessions: int, turns: int, latency: float, client: str, tokenizer_dir: str | None, api: str
) -> dict[str, Any]:
    from ..gateway import Gateway, SessionLimits

    renderer = ChatRenderer(tokenizer_or_tiny(tokenizer_dir))
    scripted = ScriptedBackend(_reply, renderer, end_token_id=renderer.stop_token_ids[0], latency=latency)
    backend = RecordingBackend(scripted)  # the gateway sets CURRENT_EPISODE to the session
    limits = SessionLimits(max_seq_len=32768, max_new_tokens=64, max_requests=turns)
    async with Gateway(backend, renderer, get_parser(renderer.family.parser), limits=limits) as gateway:
        agents, ready, go = _start_agents(gateway.base_url, sessions, turns, client, api)
        await asyncio.to_thread(ready.recv)  # the agents' process has imported and warmed up
        backend.requests.clear()
        cpu, started = time.process_time(), time.perf_counter()
        go.send("go")
        await asyncio.to_thread(ready.recv)
        gateway_wall, gateway_cpu = time.perf_counter() - started, time.process_time() - cpu
        await asyncio.to_thread(agents.join, 30)
        records = [gateway.close_session(f"s{i}") for i in range(sessions)]
    exact = sum(len(r.segments) == 1 and renders_its_messages(r.segments[0], renderer) for r in records)

    replay = backend.per_episode()
    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(_direct(scripted, requests) for requests in replay))
    direct_wall, direct_cpu = time.perf_counter() - started, time.process_time() - cpu
    await scripted.close()
    requests = sum(len(r) for r in replay)
    return {
        "benchmark": "gateway",
        "sessions": sessions,
        "turns_per_session": turns,
        "backend_latency_s": latency,
        "client": client,
        "api": api,
        "requests": requests,
        "gateway_wall_seconds": round(gateway_wall, 3),
        "direct_wall_seconds": round(direct_wall, 3),
        "ratio_gateway_to_direct": round(gateway_wall / direct_wall, 4),
        "overhead_ms_per_request": round(1000 * (gateway_wall - direct_wall) / turns, 2),
        "gateway_cpu_ms_per_request": round(1000 * gateway_cpu / max(requests, 1), 3),
        "direct_cpu_ms_per_request": round(1000 * direct_cpu / max(requests, 1), 3),
        "sessions_token_exact": exact,
    }


def _start_agents(base_url: Any, sessions: int, turns: int, client: str, api: str):
    """The agents run in their own process (as agent programs do), so that their client's CPU time
    is not the gateway's. Returns (the process, the pipe it reports on, the pipe that starts it)."""
    import multiprocessing

    if client not in ("http", "openai"):
        raise ConfigError(f"--client must be 'http' or 'openai', got {client!r}")
    context = multiprocessing.get_context("spawn")
    ready_parent, ready_child = context.Pipe()
    go_parent, go_child = context.Pipe()
    urls = [base_url(f"s{i}") for i in range(sessions)]
    process = context.Process(
        target=_agents_main, args=(urls, turns, client, api, base_url("warm-up"), ready_child, go_child), daemon=True
    )
    process.start()
    return process, ready_parent, go_parent


def _agents_main(urls: list[str], turns: int, client: str, api: str, warm_up: str, ready: Any, go: Any) -> None:
    agent = _responses_agent if api == "responses" else _agent

    async def main() -> None:
        async with _clients(client, api) as post:
            await agent(post, warm_up, 1)
            ready.send("ready")
            await asyncio.to_thread(go.recv)
            await asyncio.gather(*(agent(post, url, turns) for url in urls))
            ready.send("done")

    asyncio.run(main())


@contextlib.asynccontextmanager
async def _clients(kind: str, api: str):
    """``post(base_url, body) -> reply body`` on ``api``'s route: a plain HTTP client, or the OpenAI SDK."""
    if kind == "openai":
        import openai

        clients: dict[str, Any] = {}

        async def post(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
            sdk = clients.get(base_url) or clients.setdefault(
                base_url, openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
            )
            create = sdk.responses.create if api == "responses" else sdk.chat.completions.create
            return (await create(**body)).model_dump(exclude_none=True)

        yield post
        for sdk in clients.values():
            await sdk.close()
        return
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def post(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
            async with http.post(f"{base_url}/{ROUTES[api]}", json=body) as response:
                response.raise_for_status()
                return await response.json()

        yield post


async def _agent(post: Any, base_url: str, turns: int) -> None:
    """A tool loop as agents write it: the whole conversation is sent again each turn."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Take notes."}]
    for _ in range(turns):
        reply = await post(base_url, {"model": "m", "messages": messages, "tools": [NOTE_TOOL]})
        message = reply["choices"][0]["message"]
        messages.append(message)
        for call in message.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "noted"})


async def _responses_agent(post: Any, base_url: str, turns: int) -> None:
    """The same tool loop over the Responses API: the whole conversation is sent as input items each turn."""
    tool = {"type": "function", **NOTE_TOOL["function"]}
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Take notes."}]
    for _ in range(turns):
        reply = await post(base_url, {"model": "m", "input": items, "tools": [tool]})
        for item in reply["output"]:
            if item["type"] == "function_call":
                items.append(
                    {
                        "type": "function_call",
                        "call_id": item["call_id"],
                        "name": item["name"],
                        "arguments": item["arguments"],
                    }
                )
                items.append({"type": "function_call_output", "call_id": item["call_id"], "output": "noted"})
            else:
                items.append({"type": "message", "role": "assistant", "content": item["content"][0]["text"]})


async def _direct(backend: ScriptedBackend, requests: list[Request]) -> None:
    for request in requests:
        await backend.generate(request.prompt_ids, request.params)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--sessions", type=int, default=64, help="agents (sessions) running at once")
    parser.add_argument("--turns", type=int, default=8, help="requests per session")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per backend request")
    parser.add_argument(
        "--client",
        choices=["http", "openai"],
        default="http",
        help="how agents send requests: plain HTTP (aiohttp) or the openai SDK",
    )
    parser.add_argument(
        "--api",
        choices=sorted(ROUTES),
        default="chat",
        help="the API the agents speak: chat completions or the Responses API (POST /v1/responses)",
    )


def main(args: Any) -> dict[str, Any]:
    return run(args.sessions, args.turns, args.latency, args.client, api=args.api)


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(run(), indent=2))
