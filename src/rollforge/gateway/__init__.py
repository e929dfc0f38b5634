"""An OpenAI-compatible gateway in front of rollforge's backends that records token-exact
trajectories, and ``AgentEnvironment``: any agent program that talks to a chat-completions
endpoint, trained as an environment. See ``server.py`` (routes), ``session.py`` (recording),
``record.py`` (what a session recorded), ``forcing.py`` (tool_choice), ``wire.py`` (the OpenAI
format) and ``agent.py`` (the environment)."""

from .agent import AgentEnvironment
from .server import Address, Gateway
from .record import RecordedSegment, SessionRecord
from .session import Sampling, Session, SessionLimits

__all__ = [
    "Address",
    "AgentEnvironment",
    "Gateway",
    "RecordedSegment",
    "Sampling",
    "Session",
    "SessionLimits",
    "SessionRecord",
]
