"""``rollforge env``: list the bundled environments, or serve one as an OpenEnv server.

``rollforge env serve NAME --port P --max-concurrent N`` serves a bundled environment over
OpenEnv's protocol (``envs/openenv/serve.py``) on ``--host`` (default 127.0.0.1), so that it can
run on another machine and be played by rollforge (``OpenEnvEnvironment``), TRL or any OpenEnv
client. It needs the ``openenv-server`` extra; ``openenv`` is imported only by this command.
"""

from __future__ import annotations

from typing import Any


def add_parser(commands: Any) -> None:
    p = commands.add_parser("env", help="list bundled environments or serve one as an OpenEnv server")
    actions = p.add_subparsers(dest="env_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the bundled environments and what they are")
    listing.set_defaults(run=run_list)
    serve = actions.add_parser("serve", help="serve a bundled environment as an OpenEnv server")
    serve.add_argument("name", help="a bundled environment (see `rollforge env list`)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--max-concurrent", type=int, default=1, help="sessions (episodes) served at once")
    serve.set_defaults(run=run_serve)


def run_list(args: Any) -> int:
    from ..envs.library import ENV_NAMES, get_env_spec

    width = max(len(name) for name in ENV_NAMES)
    for name in ENV_NAMES:
        print(f"{name:<{width}}  {get_env_spec(name).description}")
    return 0


def run_serve(args: Any) -> int:
    from ..envs.library import get_env_spec
    from ..envs.openenv.serve import serve
    from ..errors import ConfigError

    get_env_spec(args.name)  # an unknown name fails before openenv's slow import
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1-65535, got {args.port}")
    if args.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent must be a positive number of sessions, got {args.max_concurrent}")
    serve(args.name, host=args.host, port=args.port, max_concurrent=args.max_concurrent)
    return 0
