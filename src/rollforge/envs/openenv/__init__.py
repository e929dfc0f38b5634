"""OpenEnv interoperability: use OpenEnv servers as rollforge environments, and serve rollforge
environments as OpenEnv servers.

- ``client.py``: ``OpenEnvEnvironment(url)``, one WebSocket session per running episode, on the
  ``websockets`` package only (extra ``openenv``); ``protocol.py`` is the wire protocol and
  ``schema.py`` turns the server's action schema into a tool and observations into text/images.
- ``serve.py``: ``build_app``/``serve`` wrap a rollforge environment in ``openenv``'s own
  ``create_app`` (extra ``openenv-server``); imported only by ``rollforge env serve``.
"""

from .client import OpenEnvEnvironment, OpenEnvSession
from ...errors import ConnectionLost, ServerError

__all__ = ["ConnectionLost", "OpenEnvEnvironment", "OpenEnvSession", "ServerError"]
