"""An OpenAI-compatible gateway in front of rollforge's backends that records token-exact
trajectories, and ``AgentEnvironment``: any agent program that talks to a chat-completions
endpoint, trained as an environment. See ``server.py`` (routes), ``session.py`` (recording),
``wire.py`` (the OpenAI format) and ``agent.py`` (the environment)."""

from .agent import AgentEnvironment
from .server import Gateway
from .session import RecordedSegment, Sampling, Session, SessionLimits, SessionRecord

__all__ = ["AgentEnvironment", "Gateway", "RecordedSegment", "Sampling", "Session", "SessionLimits", "SessionRecord"]
