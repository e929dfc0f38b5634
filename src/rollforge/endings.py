"""How an episode ends, said once. A trajectory's ending is one field; the rest is read from it::

    Trajectory.ending    terminated | truncated | max_turns_reached | error
    Trajectory.error     set exactly when the ending is ``error``: a Failure(kind, message)
    Trajectory.outcome   completed (no error) | policy_failure | infra_failure (kind in INFRA_FAILURES)

``terminated``, ``truncated`` and ``max_turns_reached`` are properties of ``Trajectory`` (and the
three flags of its JSON record, which this module reads back: ``ending_of``). Gymnasium's
distinction holds: ``terminated`` when the task reached an end state (the environment said so, or
the model answered with no tool left to run), ``truncated`` when a limit outside the task cut it
off (``max_seq_len``; ``max_new_tokens``, when the environment ended the episode on a reply cut at
it; or the environment's own limit: ``Step.truncated``), ``max_turns_reached`` at the rollout's
turn limit. A failure crosses a boundary as ``errors.EpisodeFailed`` carrying its
``Failure``; the engine files it as the ``error`` ending. The ``tool_*`` kinds never end an
episode: they are counted (``Trajectory.failures``) and reported to the model. ``Failure`` is the
value that carries a kind and its message. Nothing here imports rollforge, so the lowest floor can
use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

#: How an episode ended (``Trajectory.ending``; see the module docstring).
Ending = Literal["terminated", "truncated", "max_turns_reached", "error"]
ENDINGS: tuple[Ending, ...] = ("terminated", "truncated", "max_turns_reached", "error")

#: Failure kinds. The ``tool_*`` kinds are counted and reported back to the model; the episode goes on.
#: The others end the episode and are stored as ``Trajectory.error``.
FailureKind = Literal[
    "tool_invalid_json",  # the model's tool call is not valid JSON / not {"name", "arguments"}
    "tool_unknown",  # the model called a tool the environment does not have
    "tool_bad_arguments",  # missing, extra or mistyped arguments (schema validation failed)
    "tool_raised",  # the tool itself raised
    "env_error",  # the environment raised outside a tool (reset, step, reward)
    "env_timeout",  # one environment call exceeded the per-step timeout
    "episode_timeout",  # the whole episode exceeded the per-episode timeout
    "backend_error",  # the generation backend failed this episode's request
    "context_exceeded",  # the prompt does not fit the model's positions: no rerun can help (``ContextExceeded``)
    "template_error",  # the conversation could not be rendered into tokens
    "reward_error",  # a reward function raised (never on a trajectory: its values count as None)
    "reward_unavailable",  # a reward service (an LLM judge) failed: the reward is unknown (``RewardUnavailable``)
]


@dataclass(frozen=True)
class Failure:
    """Why something went wrong: a kind from ``FailureKind`` and a human-readable message."""

    kind: FailureKind
    message: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


#: An episode's outcome (``Trajectory.outcome``): ``completed`` (no ``error``: terminated, truncated,
#: max turns, whatever tool calls failed on the way), ``policy_failure`` (an error of the episode
#: itself, which running it again repeats: the model's own doing, e.g. ``template_error``, a
#: conversation it steered where no template renders, or its inputs', ``context_exceeded``, a
#: prompt longer than the model's positions) or ``infra_failure`` (an error of the machinery around
#: it: the backend failed, a connection was lost, an actor died, the environment raised or hung;
#: after the rollout, a reward judge failed). Infrastructure failures are kept out of group
#: baselines, their reward is unknown; those of the rollout are retried
#: (``RolloutConfig.infra_retries``), policy failures never are.
Outcome = Literal["completed", "policy_failure", "infra_failure"]
#: Error kinds that are infrastructure failures; every other ``error`` kind is a policy failure.
INFRA_FAILURES: frozenset[str] = frozenset(
    {"backend_error", "env_error", "env_timeout", "episode_timeout", "reward_unavailable"}
)


def outcome_of(error_kind: str | None) -> Outcome:
    """The outcome of an episode whose error has ``error_kind`` (None: no error)."""
    if error_kind is None:
        return "completed"
    return "infra_failure" if error_kind in INFRA_FAILURES else "policy_failure"


def ending_of(record: Mapping[str, Any]) -> Ending | None:
    """The ending a ``trajectories.jsonl`` record tells by its ``error`` and its three flags; None
    when it tells none or more than one (a record no rollforge version wrote)."""
    if record.get("error"):
        return "error"
    flagged = [name for name in ENDINGS[:3] if record.get(name)]
    return flagged[0] if len(flagged) == 1 else None
