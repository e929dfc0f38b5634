"""Any agent program as an environment: ``AgentEnvironment(run)`` or ``AgentEnvironment(cmd=[...])``.

The agent is a program that talks to a chat-completions endpoint and runs its own tool loop (the
OpenAI SDK, a framework, a coding harness). Per episode, the environment opens a session on its
own in-process ``Gateway`` (127.0.0.1, a free port, started on the first episode of a rollout
with the engine's backend, renderer and parser, closed by ``release``) and runs the agent against
that session's base URL:

- ``run(base_url, row) -> reward | None``: any async or sync callable (sync ones run on
  rollforge's worker threads, ``workers.py``);
- ``cmd=[...]``: a subprocess with ``OPENAI_BASE_URL`` (the session's base URL), ``OPENAI_API_KEY``,
  ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` (the same session, for the Messages API),
  ``ROLLFORGE_SESSION`` and ``ROLLFORGE_ROW`` (the row as JSON, also written to its stdin) in its
  environment; the last line of its stdout, when it is a number or ``{"reward": x}``, is the reward.

A program that runs several agents (a planner and an executor) names each with the ``X-Agent-ID``
header, or points each at ``<base URL without /v1>/agents/<name>/v1``: each agent's conversation is
its own segment of the episode's trajectory (``server.py``).

``row`` is the dataset row: its columns and ``prompt`` (the sample's messages). The session becomes
the episode's trajectory (``SessionRecord.trajectory``): one turn per reply, the returned reward on
the last turn (None: 0, for reward functions to score). The session's limits come from the rollout
config (``max_seq_len``, ``max_new_tokens``, ``max_turns`` requests) and so does sampling: the
requests' temperature is ignored so that the behaviour policy is the configured one. Failures use
the engine's vocabulary: an agent that raises, or a program that exits non-zero (its status and
the tail of its stderr), fails its episode only (``env_error``); one that runs past ``timeout`` or
the rollout's ``episode_timeout`` is killed (``episode_timeout``); when it closes, its session is
closed, so a runaway agent's later requests are refused (404) rather than recorded.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import shutil
import signal
import time
import uuid
from typing import Any, Awaitable, Callable, Mapping, Sequence

from ..envs.base import GeneratingEnvironment
from ..errors import ConfigError, EpisodeFailed
from ..types import Failure, Sample, Trajectory
from ..workers import run_blocking
from .server import Gateway
from .session import Sampling, SessionLimits

AgentRun = Callable[[str, Mapping[str, Any]], "float | None | Awaitable[float | None]"]

_STDERR_TAIL = 2000


class AgentEnvironment(GeneratingEnvironment):
    """An environment whose episodes are runs of an agent program against rollforge's gateway.

    ``env``: extra environment variables of ``cmd``; ``cwd``: its working directory; ``timeout``:
    seconds one run may take (the rollout's ``episode_timeout`` applies too, when shorter)."""

    max_sessions: int | None = None

    def __init__(
        self,
        run: AgentRun | None = None,
        *,
        cmd: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 600.0,
        model_name: str = "rollforge",
    ):
        if (run is None) == (cmd is None):
            raise ConfigError(
                "AgentEnvironment takes either run (a callable run(base_url, row)) or cmd (a command as a list of strings)"
            )
        if run is not None and not callable(run):
            raise ConfigError(f"AgentEnvironment run must be callable as run(base_url, row), got {type(run).__name__}")
        if cmd is not None:
            if isinstance(cmd, str) or not cmd or not all(isinstance(part, str) for part in cmd):
                raise ConfigError(f"AgentEnvironment cmd must be a non-empty list of strings (no shell), got {cmd!r}")
            if shutil.which(cmd[0], path=os.environ.get("PATH")) is None and not os.path.isfile(cmd[0]):
                raise ConfigError(f"AgentEnvironment cmd: program {cmd[0]!r} was not found on PATH")
        if not timeout > 0:
            raise ConfigError(f"AgentEnvironment timeout must be > 0 seconds, got {timeout!r}")
        self.run, self.cmd = run, tuple(cmd) if cmd is not None else None
        self.env, self.cwd, self.timeout, self.model_name = dict(env or {}), cwd, timeout, model_name
        self._is_async = inspect.iscoroutinefunction(run) or inspect.iscoroutinefunction(getattr(run, "__call__", None))
        self._gateway: Gateway | None = None
        self._starting: asyncio.Lock | None = None
        self._sessions = 64

    # -- the environment contract ------------------------------------------------------------------

    async def prepare(self, sessions: int) -> None:
        self._sessions = max(1, sessions)

    async def release(self) -> None:
        """Stop the gateway (called by the engine after each rollout)."""
        gateway, self._gateway, self._starting = self._gateway, None, None
        if gateway is not None:
            await gateway.close()

    async def run_episode(self, index: int, sample: Sample, context: Any) -> Trajectory:
        config = context.config
        gateway = await self._gateway_for(context)
        session_id = f"episode-{index}-{uuid.uuid4().hex[:12]}"
        limits = SessionLimits(config.max_seq_len, config.max_new_tokens, config.max_turns)
        gateway.open_session(session_id, limits=limits, seed=index)
        row = {"prompt": [{"role": m.role, "content": m.content} for m in sample.prompt], **sample.row}
        timeout = min(self.timeout, config.episode_timeout or math.inf)
        reward, error, started = None, None, time.perf_counter()
        try:
            async with asyncio.timeout(timeout):
                reward = await self._run(gateway.base_url(session_id), row, session_id)
            if reward is not None and (
                isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
            ):
                error, reward = (
                    Failure("env_error", f"the agent returned {reward!r}; expected a finite number or None"),
                    None,
                )
        except TimeoutError:
            error = Failure("episode_timeout", f"the agent ran past its time limit of {timeout}s and was stopped")
        except EpisodeFailed as exc:
            error = exc.failure
        except Exception as exc:
            error = Failure("env_error", f"the agent raised {type(exc).__name__}: {exc}")
        finally:
            record = gateway.close_session(session_id)
        wall = time.perf_counter() - started
        return record.trajectory(
            index,
            sample.task_name,
            reward,
            error,
            metadata={"session": session_id, "segments": len(record.segments)},
            environment_seconds=max(0.0, wall - record.generation_seconds),
        )

    # -- running the agent -------------------------------------------------------------------------

    async def _gateway_for(self, context: Any) -> Gateway:
        """The gateway for this rollout's backend, started on first use."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            gateway = self._gateway
            if gateway is not None and (
                gateway.backend is not context.backend or gateway.renderer is not context.renderer
            ):
                await gateway.close()
                gateway = None
            if gateway is None:
                config = context.config
                sampling = Sampling(
                    0.0 if config.greedy else config.temperature, config.top_p, config.top_k, config.seed, fixed=True
                )
                gateway = Gateway(
                    context.backend,
                    context.renderer,
                    context.parser,
                    model_name=self.model_name,
                    sampling=sampling,
                    open_sessions=False,
                )
                await gateway.start()
                self._gateway = gateway
            return gateway

    async def _run(self, base_url: str, row: dict[str, Any], session_id: str) -> Any:
        if self.cmd is not None:
            return await self._run_program(base_url, row, session_id)
        if self._is_async:
            return await self.run(base_url, row)
        result = await run_blocking(self.run, base_url, row)  # rollforge's workers: a hung agent is abandoned
        return await result if inspect.isawaitable(result) else result

    async def _run_program(self, base_url: str, row: dict[str, Any], session_id: str) -> float | None:
        row_json = json.dumps(row, default=str)
        env = {
            **os.environ,
            **self.env,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_API_KEY": "rollforge",
            "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": "rollforge",
            "ROLLFORGE_SESSION": session_id,
            "ROLLFORGE_ROW": row_json,
        }
        process = await asyncio.create_subprocess_exec(
            *self.cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group: stopped with its children
        )
        try:
            out, err = await process.communicate(row_json.encode())
        except BaseException:  # cancelled (the time limit): stop the program and whatever it started
            if process.returncode is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await process.wait()
            raise
        if process.returncode != 0:
            status = (
                f"was killed by signal {-process.returncode}"
                if process.returncode < 0
                else f"exited with status {process.returncode}"
            )
            tail = err.decode("utf-8", "replace")[-_STDERR_TAIL:].strip()
            raise EpisodeFailed(
                Failure("env_error", f"the agent program {self.cmd[0]!r} {status}; stderr: {tail or '(empty)'}")
            )
        return _reward_from(out.decode("utf-8", "replace"))


def _reward_from(stdout: str) -> float | None:
    """The reward a program printed last: a number or ``{"reward": x}``; None when it printed neither."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    if isinstance(value, Mapping):
        value = value.get("reward")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
