"""A free TCP port: the one place rollforge asks the system for one.

Binding port 0 lets the kernel pick a port nothing listens on; the socket closes at once, so the
port is free *now* (a caller binds it next; another process could take it between, which the
callers accept: a test server, ``rollforge env serve --port 0``, a training rank's rendezvous).
IPv6 hosts (a ``:`` in the host) get an IPv6 socket. An ``OSError`` (the host is not this
machine's) reaches the caller, which words it for its user.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
