"""Rollout settings: closed (an unknown key is an error), typed, documented next to each field.

``describe_validation_error`` is the one place a pydantic ``ValidationError`` of any config (this
one, training, SFT, Ray) becomes the words a user reads: one ``key: what was expected (got
value)`` per problem, the key written as the user writes it (``sources[0].episodes``).
"""

from __future__ import annotations

from typing import Any, Collection, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import ConfigError


class RolloutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mode: Literal["async", "lockstep"] = "async"
    """``async``: each episode proceeds on its own (generation of one overlaps environment steps of
    others). ``lockstep``: all active episodes generate together, then all step together."""
    max_turns: int = Field(8, ge=1)
    """Assistant turns per episode; episodes still running after them count as max-turns-reached."""
    max_seq_len: int = Field(4096, ge=2)
    """Token limit of a whole episode; an observation that reaches it is cut and the episode is
    marked truncated. At most the model's positions: training refuses more before the model loads."""
    max_new_tokens: int = Field(256, ge=1)
    """Token budget of one assistant turn."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature (0 is greedy)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: keep the smallest set of tokens with this much probability."""
    top_k: int = Field(0, ge=0)
    """Sample among the k most likely tokens (0: all)."""
    greedy: bool = False
    """Greedy decoding (evaluation); overrides temperature."""
    concurrency: int = Field(64, ge=1)
    """Episodes running at once (lockstep: the size of each lockstep wave)."""
    step_timeout: float | None = Field(60.0, gt=0)
    """Seconds one environment call (reset, step, reward, close) may take; None: no limit. A call
    past it fails its episode (``env_timeout``); a sync call is abandoned on its worker thread.
    Left unset, it is lowered to ``episode_timeout`` when that is shorter."""
    episode_timeout: float | None = Field(1800.0, gt=0)
    """Seconds a whole episode may take (``episode_timeout`` failure); None: no limit."""
    request_timeout: float | None = Field(600.0, gt=0)
    """Seconds one generation request may take, waiting in the backend's queue included
    (``backend_error``); None: no limit beyond ``episode_timeout``."""
    infra_retries: int = Field(0, ge=0)
    """Times an episode that ended in an infrastructure failure (``backend_error``, ``env_error``,
    ``env_timeout``, ``episode_timeout``; see ``types.INFRA_FAILURES``) is run again, from the start
    with the same seeds; ``Trajectory.retries`` counts the reruns. Policy failures are never rerun."""
    seed: int = 0
    """Sampling seeds of every request derive from it, the episode index and the turn."""
    first_index: int = Field(0, ge=0)
    """Episode index of the first sample (indices, and the seeds and tool-call ids derived from
    them, count on from it): a batch split over ranks samples what it would sample whole."""
    tool_parser: str | None = None
    """How tool calls are written by the model (see ``chat/toolcalls.py``); None: the model
    family's parser (``chat/families.py``)."""
    engine_workers: int = Field(1, ge=1)
    """Engine processes the episodes are spread over (``rollout/engine_workers.py``): each runs its
    share of the samples on its own event loop, generating through this process's backend. 1: all
    in this process. Same trajectories for any number (a deterministic backend)."""
    check_template: bool = True
    """Check at start-up that the chat template renders the prompts in use (tools are always
    checked when an environment first offers them)."""

    @model_validator(mode="before")
    @classmethod
    def _step_within_episode(cls, values: Any) -> Any:
        """An ``episode_timeout`` below the default step timeout lowers it, unless it was given."""
        if isinstance(values, dict) and "step_timeout" not in values:
            episode, default = values.get("episode_timeout"), cls.model_fields["step_timeout"].default
            if isinstance(episode, (int, float)) and not isinstance(episode, bool) and 0 < episode < default:
                values = {**values, "step_timeout": episode}
        return values

    @model_validator(mode="after")
    def _timeouts_consistent(self) -> "RolloutConfig":
        if self.step_timeout and self.episode_timeout and self.step_timeout > self.episode_timeout:
            raise ValueError(
                f"step_timeout ({self.step_timeout}) is larger than episode_timeout ({self.episode_timeout}); "
                "expected step_timeout <= episode_timeout"
            )
        return self

    @classmethod
    def build(cls, **values) -> "RolloutConfig":
        """Construct from user values, raising ``ConfigError`` that names bad keys and values."""
        from pydantic import ValidationError

        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(f"invalid rollout config: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: Any, tags: Collection[str] = ()) -> str:
    """Each problem of a pydantic ``ValidationError`` as ``key: what was expected (got value)``,
    joined by ``; ``. A check across keys (a model validator) gives its own message, without the
    section it was handed. ``tags``: the discriminator values of tagged unions, which pydantic puts
    in the key path (``sources.0.expert.episodes``) and the user never writes."""
    return "; ".join(_problem(e, tags) for e in exc.errors())


def _problem(error: dict[str, Any], tags: Collection[str]) -> str:
    key = ""
    for n, part in enumerate(error["loc"]):
        if isinstance(part, int):
            key += f"[{part}]"
        elif not (n and isinstance(error["loc"][n - 1], int) and part in tags):
            key += f".{part}" if key else str(part)
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        message, got = "required, but not given", ""
    elif error["type"] == "extra_forbidden":
        message, got = "unknown key", ""
    elif error["type"] == "value_error" and isinstance(error.get("input"), dict):
        got = ""  # a check across the keys of a section: its message names them and their values
    else:
        got = f" (got {error.get('input')!r:.80})"
    return f"{key}: {message}{got}" if key else f"{message}{got}"
