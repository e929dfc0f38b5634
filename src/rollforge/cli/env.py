"""``rollforge env``: list the bundled environments, or serve one as an OpenEnv server.

``rollforge env list`` lists every bundled name; a family member whose library is not installed
(``reasoning_gym:...`` without the ``reasoning-gym`` extra) is listed with the extra it needs.

``rollforge env serve NAME --port P --max-concurrent N`` serves a bundled environment over
OpenEnv's protocol (``envs/openenv/serve.py``) on ``--host`` (default 127.0.0.1; ``--port 0``: a free
port, chosen here and printed, as ``gateway --port 0`` does), so that it can
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
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (0: a free one, printed at start)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    serve.add_argument("--max-concurrent", type=int, default=1, help="sessions (episodes) served at once")
    serve.set_defaults(run=run_serve)


def run_list(args: Any) -> int:
    """Every bundled name with its description; one whose library is not installed with the extra
    that installs it, so that the listing is whole (exit 0) whatever is installed."""
    from ..envs.library import ENV_NAMES, get_env_spec
    from ..errors import MissingDependency

    width = max(len(name) for name in ENV_NAMES)
    for name in ENV_NAMES:
        try:
            description = get_env_spec(name).description
        except MissingDependency as missing:
            description = f"(needs its library: pip install 'rollforge[{missing.extra}]')"
        print(f"{name:<{width}}  {description}")
    return 0


def run_serve(args: Any) -> int:
    from ..envs.library import get_env_spec
    from ..envs.openenv.serve import serve
    from ..errors import ConfigError

    get_env_spec(args.name)  # an unknown name fails before openenv's slow import
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be in 0-65535 (0: a free one), got {args.port}")
    if args.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent must be a positive number of sessions, got {args.max_concurrent}")
    port = args.port or _free_port(args.host)
    serve(args.name, host=args.host, port=port, max_concurrent=args.max_concurrent)  # it prints the port
    return 0


def _free_port(host: str) -> int:
    """A port free on ``host`` now, as the system picks one for port 0 (``gateway --port 0`` too)."""
    from ..errors import ConfigError
    from ..ports import free_port

    try:
        return free_port(host)
    except OSError as exc:
        raise ConfigError(f"--host {host!r}: cannot bind a port there ({exc.strerror or exc})") from None
