"""Step-style batched environments (the NeMo-RL design) behind the ``EnvSession`` contract.

A user environment has one method::

    def step(self, message_logs: list[list[dict]], metadata: list[Any]) -> StepwiseReturn

(``async def`` works too). Each message log is one sample's conversation as ``{"role", "content"}``
dicts; ``metadata`` is each sample's environment info. The return holds one entry per sample:
an observation dict, the new metadata, the next turn's stop strings, a reward and ``terminated``,
and optionally ``truncated`` (a sixth field, ``truncateds``: a limit outside the task cut the
episode off, Gymnasium's distinction). Any object with the five attributes is accepted, so NeMo-RL's
``EnvironmentReturn`` namedtuple (which also carries ``answers``, and tensors for rewards and
terminateds, and has no truncateds) works unchanged.

The engine steps each episode on its own, so ``StepwiseEnvironment`` *coalesces* ``step`` calls:
the first call of a batch opens a collection window that stays open while the event loop turns
twice; every call that arrives meanwhile joins the same ``env.step`` call. Lockstep rollouts (all
episodes step in the same loop iteration) thus make one batched call per turn, and async rollouts
make small batches of whatever finished generating together. Like a NeMo-RL environment actor, the
environment gets one ``step`` call at a time (per event loop), so user code need not be
thread-safe; calls that arrive while a batch runs form the next batch. Should every caller of a
running batch give up (the engine's step timeout), the batch is abandoned so that a hung
environment cannot block later batches (an abandoned thread may still be running then).
An exception from ``env.step`` fails every episode of that batch: each one's ``step`` raises it.

Per session: the initial metadata is ``sample.row["metadata"]`` when the row has that column, else
a dict of the whole row (deep-copied, so an environment that mutates it in place cannot leak state
between episodes). As in NeMo-RL, the metadata a step returns replaces it unless the entry is None
(None keeps the current metadata; the trajectory records the last metadata, also that of the
terminating step, which NeMo-RL drops), and a None entry of ``next_stop_strings`` keeps the
current stop strings (NeMo-RL's per-sample rule; its batched loop clears them instead, which is
the same for environments that always return None). An observation's role defaults to
``"user"`` (NeMo-RL's ``"environment"`` role also maps to ``"user"``); an observation with empty
content on a step that ends the episode adds no message.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..boundary import call_user
from ..errors import ConfigError, EnvironmentError_
from ..types import Message, Sample
from ..workers import run_blocking
from .base import BaseSession, Environment, Reset, Step, check_max_sessions

__all__ = ["StepwiseReturn", "StepwiseEnvironment", "StepwiseSession"]

#: How many times the loop turns while a batch is collected; calls arriving meanwhile join it.
_GATHER_YIELDS = 2

_RETURN_FIELDS = ("observations", "metadata", "next_stop_strings", "rewards", "terminateds")

#: Observation roles that are not chat roles but mean "the environment speaks to the model".
_USER_ALIASES = ("environment", "env", "observation")


@dataclass(frozen=True)
class StepwiseReturn:
    """What a step-style environment returns for a batch of ``n`` samples: every field has ``n``
    entries, in the order of the ``message_logs`` it was given."""

    #: One ``{"role", "content"}`` dict per sample; the role defaults to ``"user"``.
    observations: list[dict]
    #: The new metadata of each sample, handed back on its next step.
    metadata: list[Any]
    #: Stop strings for each sample's next turn; None keeps the current ones.
    next_stop_strings: list[list[str] | None]
    #: This turn's reward of each sample.
    rewards: list[float]
    #: Whether each sample's episode ended naturally (the task reached an end state).
    terminateds: list[bool]
    #: Whether each sample's episode was cut off by a limit outside the task (None: none was).
    truncateds: list[bool] | None = None

    @classmethod
    def final(cls, rewards: list[float], metadata: list[Any]) -> "StepwiseReturn":
        """A single-turn verdict: every sample ends now with its reward, and no observation."""
        n = len(rewards)
        return cls([{"role": "user", "content": ""}] * n, list(metadata), [None] * n, list(rewards), [True] * n)


@dataclass(frozen=True)
class _Outcome:
    """One sample's share of a batched step, already validated."""

    step: Step
    metadata: Any


@dataclass
class _Request:
    message_log: list[dict[str, Any]]
    metadata: Any
    future: asyncio.Future[_Outcome]


class StepwiseEnvironment(Environment):
    """Adapts a step-style environment object to ``Environment``.

    Args:
        env: An object with ``step(message_logs, metadata)``, sync or async.
        max_sessions: How many episodes may run at once (None: no limit).
        run_in_thread: Run a sync ``step`` on rollforge's worker threads (``workers.py``) so a slow
            or hung environment never blocks the event loop. Set False for trivial, fast environments.
    """

    def __init__(self, env: Any, *, max_sessions: int | None = None, run_in_thread: bool = True):
        if not callable(getattr(env, "step", None)):
            raise ConfigError(
                f"a step-style environment needs a step(message_logs, metadata) method; {type(env).__name__} has none"
            )
        check_max_sessions(max_sessions)
        self.env = env
        self.max_sessions = max_sessions
        self.run_in_thread = run_in_thread
        self.name = type(env).__name__
        # Per event loop: the requests waiting for the next batch, and the task running batches.
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Request]] = weakref.WeakKeyDictionary()
        self._workers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    def __getstate__(self) -> dict[str, Any]:
        """A copy (shipped to an environment actor) starts with no pending batches: those belong
        to this process's event loops."""
        state = dict(self.__dict__)
        del state["_queues"], state["_workers"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._queues, self._workers = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"StepwiseEnvironment({self.name}, max_sessions={self.max_sessions})"

    def open(self, sample: Sample) -> StepwiseSession:
        return StepwiseSession(self, sample)

    # -- batching --------------------------------------------------------------------------------

    async def submit(self, message_log: list[dict[str, Any]], metadata: Any) -> _Outcome:
        """Queue one sample's step for the next batch on this loop and await its share."""
        loop = asyncio.get_running_loop()
        request = _Request(message_log, metadata, loop.create_future())
        queue = self._queues.setdefault(loop, [])
        queue.append(request)
        if loop not in self._workers:
            self._workers[loop] = loop.create_task(self._work(loop, queue))
        return await request.future

    async def _work(self, loop: asyncio.AbstractEventLoop, queue: list[_Request]) -> None:
        """Run batches one after another while requests keep coming, then stop."""
        try:
            while queue:
                for _ in range(_GATHER_YIELDS):  # let the other steps of this turn arrive
                    await asyncio.sleep(0)
                batch = [r for r in queue if not r.future.done()]  # skip callers that gave up
                queue.clear()
                if batch:
                    await self._run_batch(batch)
        except asyncio.CancelledError:  # the loop is shutting down: nobody will run these
            for request in queue:
                request.future.cancel()
            queue.clear()
            raise
        finally:
            # No await since `while queue` saw it empty, so no request can be stranded.
            self._workers.pop(loop, None)

    async def _run_batch(self, batch: list[_Request]) -> None:
        call = asyncio.ensure_future(self._call([r.message_log for r in batch], [r.metadata for r in batch]))

        def abandon_when_nobody_waits(_: asyncio.Future[_Outcome]) -> None:
            # Every caller timed out: stop waiting, so a hung step cannot block later batches.
            if not call.done() and all(r.future.done() for r in batch):
                call.cancel()

        for request in batch:
            request.future.add_done_callback(abandon_when_nobody_waits)
        try:
            await asyncio.wait((call,))
        except asyncio.CancelledError:
            call.cancel()
            for request in batch:
                request.future.cancel()
            raise
        if call.cancelled():
            for request in batch:
                request.future.cancel()
            return
        try:
            outcomes = self._unpack(call.result(), len(batch))
        except Exception as exc:  # the env raised or broke the contract: the whole batch fails
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        for request, outcome in zip(batch, outcomes):
            if not request.future.done():
                request.future.set_result(outcome)

    async def _call(self, message_logs: list[list[dict[str, Any]]], metadata: list[Any]) -> Any:
        step = self.env.step
        if inspect.iscoroutinefunction(step) or not self.run_in_thread:
            result = call_user(step, message_logs, metadata)
        else:
            result = await run_blocking(step, message_logs, metadata)
        if inspect.isawaitable(result):
            result = await result
        return result

    # -- validation ------------------------------------------------------------------------------

    def _unpack(self, result: Any, n: int) -> list[_Outcome]:
        for field_name in _RETURN_FIELDS:
            if not hasattr(result, field_name):
                raise EnvironmentError_(
                    f"{self.name}.step returned a {type(result).__name__} without "
                    f"'{field_name}'; return a StepwiseReturn({', '.join(_RETURN_FIELDS)})"
                )
        columns = [self._column(getattr(result, f), f, n) for f in _RETURN_FIELDS]
        truncateds = getattr(result, "truncateds", None)  # optional: NeMo-RL's return has none
        columns.append([False] * n if truncateds is None else self._column(truncateds, "truncateds", n))
        return [self._outcome(i, *(column[i] for column in columns)) for i in range(n)]

    def _column(self, value: Any, field_name: str, n: int) -> list[Any]:
        column = _as_list(value)
        if column is None:
            raise EnvironmentError_(
                f"{self.name}.step returned {field_name} of type {type(value).__name__}; expected a list of {n}"
            )
        if len(column) != n:
            raise EnvironmentError_(
                f"{self.name}.step was given a batch of {n} but returned {len(column)} "
                f"{field_name}; every field needs one entry per sample"
            )
        return column

    def _outcome(
        self, i: int, observation: Any, metadata: Any, stop: Any, reward: Any, terminated: Any, truncated: Any
    ) -> _Outcome:
        where = f"{self.name}.step, sample {i} of the batch"
        reward = _scalar(reward)
        terminated, truncated = _flag(terminated, "terminated", where), _flag(truncated, "truncated", where)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise EnvironmentError_(f"{where}: reward must be a number, got {reward!r}")
        if not math.isfinite(reward):
            raise EnvironmentError_(f"{where}: reward must be finite, got {reward!r}")
        if stop is not None:
            if isinstance(stop, str) or not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
                raise EnvironmentError_(f"{where}: next_stop_strings must be a list of str or None, got {stop!r}")
            stop = tuple(stop)
        message = _observation_message(observation, terminated or truncated, where)
        step = Step(
            messages=(message,) if message is not None else (),
            reward=float(reward),
            terminated=terminated,
            truncated=truncated,
            stop=stop,
        )
        return _Outcome(step=step, metadata=metadata)


class StepwiseSession(BaseSession):
    """One episode of a ``StepwiseEnvironment``: holds the sample's metadata between steps."""

    def __init__(self, environment: StepwiseEnvironment, sample: Sample):
        self._environment = environment
        self._metadata = _initial_metadata(sample)
        self._stepping = False

    async def reset(self, sample: Sample) -> Reset:
        self._metadata = _initial_metadata(sample)
        return Reset(prompt=sample.prompt)

    async def step(self, conversation: tuple[Message, ...]) -> Step:
        if self._stepping:
            raise EnvironmentError_(f"{self._environment.name}: step() called again before the previous step returned")
        self._stepping = True
        try:
            outcome = await self._environment.submit([m.to_chat() for m in conversation], self._metadata)
        finally:
            self._stepping = False
        if outcome.metadata is not None:  # NeMo-RL's rule: None keeps the current metadata
            self._metadata = outcome.metadata
        return outcome.step

    @property
    def metadata(self) -> Any:
        return self._metadata

    @property
    def handle(self) -> Any:
        return self._environment.env


def _initial_metadata(sample: Sample) -> Any:
    row = sample.row
    return copy.deepcopy(row["metadata"] if "metadata" in row else dict(row))


def _as_list(value: Any) -> list[Any] | None:
    """Lists and tuples as they are; tensors and arrays through ``tolist()``."""
    if isinstance(value, (list, tuple)):
        return list(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        listed = tolist()
        return listed if isinstance(listed, list) else None
    return None


def _scalar(value: Any) -> Any:
    """A numpy scalar or 0-d tensor as the Python number it holds; anything else unchanged."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    return value


def _flag(value: Any, name: str, where: str) -> bool:
    """A bool, or 0/1 as a Python, numpy or 0-d tensor number (NeMo-RL returns tensors)."""
    value = _scalar(value)
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise EnvironmentError_(f"{where}: {name} must be a bool, got {value!r}")


def _observation_message(observation: Any, ended: bool, where: str) -> Message | None:
    if not isinstance(observation, Mapping):
        raise EnvironmentError_(f"{where}: an observation must be a {{'role', 'content'}} dict, got {observation!r}")
    content = observation.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise EnvironmentError_(f"{where}: observation content must be a str, got {type(content).__name__}")
    if ended and not content:
        return None
    role = observation.get("role") or "user"
    if role in _USER_ALIASES:
        role = "user"
    if role not in ("system", "user", "assistant", "tool"):
        raise EnvironmentError_(f"{where}: observation role {role!r} is not one of user/tool/system/assistant")
    return Message(role=role, content=content, name=observation.get("name"))
