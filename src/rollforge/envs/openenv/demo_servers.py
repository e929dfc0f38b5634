"""Small OpenEnv environments written against ``openenv`` itself, served by ``create_app``: the
servers the OpenEnv tests and ``rollforge bench env-throughput`` run against.

- ``counter`` (multi-turn, tool mode): ``AddAction(n)``; the counter starts at ``seed % 3``; each
  step adds ``n`` (``n > 10`` raises: an ``EXECUTION_ERROR``); at 5 the episode ends with reward 1.0
  (past 5 with 0.0). Observation metadata ``live`` counts the live environment instances of the
  process, so a test can see how many sessions the server held at once.
- ``quiz`` (single-turn, text mode): ``AnswerAction(answer)``; "What is a + b?" with ``a, b`` from
  the seed; reward 1.0 when the last number of the answer is the sum; always done.
- ``picture`` (tool mode, images): like ``counter`` but each observation also carries the counter
  as a tiny PNG in the ``image`` field (marked ``contentMediaType: image/png`` in the schema).
- ``endless`` (tool mode): ``AddAction(n)`` that never ends; for throughput measurements.

Run ``python -m rollforge.envs.openenv.demo_servers NAME:PORT:MAX_CONCURRENT ...`` to serve
several of them from one process (one ``openenv`` import, which takes seconds) on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
import re
import struct
import sys
import zlib
from typing import Any, Optional

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

_LIVE = 0


class AddAction(Action):
    """Add a number to the counter."""

    n: int = Field(description="How much to add (at most 10).")


class AnswerAction(Action):
    answer: str = Field(description="The answer")


class TextObservation(Observation):
    text: str = ""


class PictureObservation(Observation):
    text: str = ""
    image: Optional[str] = Field(
        default=None, json_schema_extra={"contentMediaType": "image/png", "contentEncoding": "base64"}
    )


class _Base(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        global _LIVE
        super().__init__()
        _LIVE += 1
        self._state = State(step_count=0)
        self._closed = False

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        global _LIVE
        if not self._closed:
            self._closed, _LIVE = True, _LIVE - 1

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        return asyncio.run(self.step_async(action, timeout_s, **kwargs))


class CounterEnv(_Base):
    observation_cls: Any = TextObservation
    target: int | None = 5

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self.total = (seed or 0) % 3
        self._state = State(episode_id=episode_id, step_count=0)
        return self._observe(f"The counter starts at {self.total}.", done=False, reward=None)

    async def step_async(self, action: AddAction, timeout_s: float | None = None, **_: Any) -> Any:
        if action.n > 10:
            raise ValueError(f"n={action.n} is too large; add at most 10")
        self.total += action.n
        self._state.step_count += 1
        done = self.target is not None and self.total >= self.target
        return self._observe(
            f"total={self.total}", done=done, reward=(1.0 if self.total == self.target else 0.0) if done else 0.0
        )

    def _observe(self, text: str, *, done: bool, reward: float | None) -> Any:
        return self.observation_cls(text=text, done=done, reward=reward, metadata={"live": _LIVE, "total": self.total})


class EndlessEnv(CounterEnv):
    target = None


class PictureEnv(CounterEnv):
    observation_cls = PictureObservation

    def _observe(self, text: str, *, done: bool, reward: float | None) -> Any:
        return PictureObservation(
            text=text, image=base64.b64encode(_png(self.total)).decode(), done=done, reward=reward
        )


class QuizEnv(_Base):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Any:
        self.a, self.b = (seed or 0) % 10, (seed or 0) // 10 % 10
        return TextObservation(text=f"What is {self.a} + {self.b}?")

    async def step_async(self, action: AnswerAction, timeout_s: float | None = None, **_: Any) -> Any:
        numbers = re.findall(r"-?\d+", action.answer)
        right = bool(numbers) and int(numbers[-1]) == self.a + self.b
        return TextObservation(
            text="Correct." if right else f"Wrong: {self.a + self.b}.", done=True, reward=float(right)
        )


def _png(value: int) -> bytes:
    """A 1x1 grey PNG whose shade is ``value`` (no PIL needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    pixel = zlib.compress(bytes([0, (value * 40) % 256]))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", pixel)
        + chunk(b"IEND", b"")
    )


APPS = {
    "counter": (CounterEnv, AddAction, TextObservation),
    "endless": (EndlessEnv, AddAction, TextObservation),
    "picture": (PictureEnv, AddAction, PictureObservation),
    "quiz": (QuizEnv, AnswerAction, TextObservation),
}


async def _serve(specs: list[str]) -> None:
    import uvicorn

    servers = []
    for spec in specs:
        name, port, limit = spec.split(":")
        env_cls, action_cls, observation_cls = APPS[name]
        app = create_app(env_cls, action_cls, observation_cls, env_name=name, max_concurrent_envs=int(limit))
        config = uvicorn.Config(app, host="127.0.0.1", port=int(port), log_level="warning")
        servers.append(uvicorn.Server(config))
    await asyncio.gather(*(server.serve() for server in servers))


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1:]))
