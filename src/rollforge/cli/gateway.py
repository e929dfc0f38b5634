"""``rollforge gateway``: serve a model as an OpenAI-compatible endpoint that records sessions.

Point any agent at ``http://127.0.0.1:PORT/sessions/<id>/v1`` (or send ``X-Rollforge-Session``):
each session's conversation is rendered with the model's chat template and recorded token-exactly.
``GET /sessions/<id>/trajectory`` returns a session's trajectory so far; ``--record FILE`` writes
every session's trajectory as JSON lines when the server stops (Ctrl-C / SIGTERM). It listens on
127.0.0.1 unless ``--host`` says otherwise. One event loop runs the backend and the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import atomic_write


def add_parser(commands: Any) -> None:
    p = commands.add_parser("gateway", help="serve a model over OpenAI's chat-completions API, recording each session")
    p.add_argument("--model", default="smollm2-135m", help="local model directory, hub id or alias (smollm2-135m)")
    p.add_argument(
        "--backend",
        choices=["hf", "vllm", "openai"],
        default="hf",
        help="generation backend (openai: a vLLM/SGLang server serving the same model)",
    )
    p.add_argument("--base-url", default=None, help="server of the openai backend, e.g. http://127.0.0.1:8000")
    p.add_argument("--served-model-name", default=None, help="model name on the openai backend's server")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: a free one, printed at start)")
    p.add_argument("--tool-parser", default=None, help="tool-call format (default: the model family's)")
    p.add_argument("--max-seq-len", type=int, default=8192, help="tokens of one session segment")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="tokens of one reply")
    p.add_argument("--max-requests", type=int, default=256, help="requests answered per session")
    p.add_argument("--session-timeout", type=float, default=None, help="seconds a session may last")
    p.add_argument("--concurrency", type=int, default=64, help="generation requests in flight")
    p.add_argument("--seed", type=int, default=None, help="seed of requests that carry none")
    p.add_argument("--record", type=Path, default=None, help="write every session's trajectory here (JSONL) on exit")
    p.set_defaults(run=run)


def run(args: Any) -> int:
    for name in ("max_seq_len", "max_new_tokens", "max_requests", "concurrency"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    asyncio.run(_serve(args))
    return 0


async def _serve(args: Any) -> None:
    from ..backends.config import BackendConfig
    from ..backends.opening import open_backend
    from ..chat.render import ChatRenderer
    from ..gateway import Address, Gateway, Sampling, SessionLimits
    from ..models import load_tokenizer

    backend_config = BackendConfig(
        kind=args.backend,
        model=args.model,
        base_url=args.base_url,
        served_model_name=args.served_model_name,
        concurrency=args.concurrency,
        seed=args.seed,
        check_reachable=True,
    )
    tokenizer = load_tokenizer(args.model)
    renderer = ChatRenderer(tokenizer)
    parser = renderer.parser(args.tool_parser)
    limits = SessionLimits(args.max_seq_len, args.max_new_tokens, args.max_requests, args.session_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with (
        open_backend(backend_config, tokenizer=tokenizer) as backend,
        Gateway(
            backend,
            renderer,
            parser,
            model_name=os.path.basename(str(args.model).rstrip("/")),
            limits=limits,
            sampling=Sampling(seed=args.seed),
            address=Address(args.host, args.port),
        ) as gateway,
    ):
        print(
            f"rollforge gateway: serving {args.model} ({renderer.family.name} family, {args.backend} backend) "
            f"on {gateway.base_url()}; per session: {gateway.base_url('<id>')}",
            flush=True,
        )
        await stop.wait()
        if args.record is not None:
            _write_records(args.record, gateway)


def _write_records(path: Path, gateway: Any) -> None:
    lines = [json.dumps(gateway.trajectory_json(sid)) for sid in sorted(gateway.sessions)]
    atomic_write(path, "".join(line + "\n" for line in lines))
    print(f"rollforge gateway: {len(lines)} session(s) recorded -> {path}", flush=True)
