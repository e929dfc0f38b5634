"""The checks a rollout runs on its inputs before anything is generated (``engine.arollout``;
``check_prompt_lengths`` also runs early in the CLI, and ``check_prompts`` in training, before the
model loads).
An engine worker runs its shard unchecked (``engine.run_checked``): its rollout's process checked
the whole batch.

The checks that depend on the prompts alone (their environments, the renderer, ``max_seq_len``, the
tool parser and ``check_template``) are ``check_prompts``, which returns what passed as a
``CheckedPrompts``. A caller that checked its prompts once (training, before the model loads)
passes a batch drawn from them as ``CheckedPrompts.batch(samples)`` (a ``CheckedBatch``) in
place of the samples, and ``arollout`` checks again only what the batch does not cover: the
samples passed, the same renderer and the same settings (``CheckedPrompts.covers``). The backend,
the number of samples and the sessions they need are checked on every call.

The model's positions (``model_positions``, read from its ``config.json`` without loading it) bound
``max_seq_len`` where the model is known before the first step (the CLI, training's preflight):
a ``max_seq_len`` above them is refused in one line naming both numbers (``fit_max_seq_len``;
left unset, the CLI's default is lowered to them), and a prompt longer than them is named with
both numbers (``check_prompt_lengths``). The engine itself does not know the model: a prompt the
backend refuses as too long for it fails its episode as ``context_exceeded`` (``calls.py``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Backend
from ..chat.render import ChatRenderer
from ..envs.base import Environment, GeneratingEnvironment
from ..envs.factory import check_routes
from ..errors import ConfigError, TemplateError
from ..types import Sample
from .config import RolloutConfig


def check_rollout(
    samples: Sequence[Sample],
    task_to_env: Mapping[str, Environment],
    backend: Backend,
    renderer: ChatRenderer,
    config: RolloutConfig,
    capacity: bool = True,
    checked: CheckedPrompts | None = None,
) -> None:
    """Every check of ``arollout``'s inputs (see ``engine``'s docstring), one ``ConfigError`` for the
    first that fails; ``capacity``: also environments' session limits (not for a shared session);
    ``checked``: prompts already checked, whose checks are not run again for samples it covers."""
    if not samples:
        raise ConfigError("no samples to roll out: expected at least one Sample")
    if checked is None or not checked.covers(samples, task_to_env, renderer, config):
        check_prompts(samples, task_to_env, renderer, config)
    check_backend(backend)
    if capacity:
        check_capacity(
            task_to_env,
            sessions_needed(samples, task_to_env, config),
            f"concurrency={config.concurrency}, {len(samples)} samples",
        )


def check_prompts(
    samples: Sequence[Sample],
    task_to_env: Mapping[str, Environment],
    renderer: ChatRenderer,
    config: RolloutConfig,
    setting: str = "max_seq_len",
    positions: int | None = None,
) -> CheckedPrompts:
    """The checks of ``arollout``'s inputs that depend on the prompts alone: every task has an
    ``Environment``, every ``environment`` column names one, every prompt leaves room to generate
    (``check_prompt_lengths``, with ``setting`` and ``positions``) and, with ``check_template``, the
    template renders each task's prompt. Returns what passed."""
    check_tasks(samples, task_to_env)
    check_environments(task_to_env)
    check_routes(samples, task_to_env)
    parser = renderer.parser(config.tool_parser)
    check_prompt_lengths(samples, renderer, config.max_seq_len, setting, task_to_env, parser, positions)
    if config.check_template:  # tools are checked when an environment first offers them
        for prompt in {s.task_name: s.prompt for s in samples}.values():
            renderer.check_template(prompt, (), parser)
    return CheckedPrompts(tuple(samples), renderer, config.max_seq_len, config.tool_parser, config.check_template)


@dataclass(frozen=True, eq=False)
class CheckedPrompts:
    """Samples that passed ``check_prompts`` with ``renderer`` under these settings, held here so
    that their ids stay theirs: a rollout of any of them (``batch``) is not checked again."""

    samples: tuple[Sample, ...] = field(repr=False)
    renderer: ChatRenderer = field(repr=False)
    max_seq_len: int
    tool_parser: str | None
    template: bool
    #: The samples' ids and task names, for ``covers``.
    ids: frozenset[int] = field(init=False, repr=False)
    tasks: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", frozenset(map(id, self.samples)))
        object.__setattr__(self, "tasks", frozenset(s.task_name for s in self.samples))

    def batch(self, samples: Sequence[Sample]) -> CheckedBatch:
        """``samples`` (drawn from these) to pass to ``arollout`` in place of a list."""
        return CheckedBatch(tuple(samples), self)

    def covers(
        self, samples: Sequence[Sample], task_to_env: Mapping[str, Any], renderer: ChatRenderer, config: RolloutConfig
    ) -> bool:
        """Whether ``check_prompts`` would check nothing new for this rollout: every sample is one
        of these, the renderer and the settings are the same, and every task still has an
        environment (the one checked, or its stand-in: an actor pool on Ray)."""
        return (
            renderer is self.renderer
            and (config.max_seq_len, config.tool_parser) == (self.max_seq_len, self.tool_parser)
            and (self.template or not config.check_template)
            and self.tasks <= task_to_env.keys()
            and all(id(sample) in self.ids for sample in samples)
        )


@dataclass(frozen=True, eq=False)
class CheckedBatch(Sequence[Sample]):
    """Samples drawn from prompts checked once (``CheckedPrompts.batch``): ``arollout`` takes it
    in place of a list of samples, and skips the checks it covers."""

    samples: tuple[Sample, ...]
    prompts: CheckedPrompts

    def __getitem__(self, index: Any) -> Any:
        return self.samples[index]

    def __len__(self) -> int:
        return len(self.samples)


def check_tasks(samples: Sequence[Sample], task_to_env: Mapping[str, Environment]) -> None:
    unknown = sorted({s.task_name for s in samples} - set(task_to_env))
    if unknown:
        raise ConfigError(
            f"unknown task name(s) {unknown}: no environment is registered for them; "
            f"task_to_env has {sorted(task_to_env)}"
        )


def check_prompt_lengths(
    samples: Sequence[Sample],
    renderer: Any,
    max_seq_len: int,
    setting: str,
    task_to_env: Mapping[str, Environment] | None = None,
    parser: Any = None,
    positions: int | None = None,
) -> None:
    """Refuse prompts that leave no room to generate under ``max_seq_len`` (``setting`` names the
    option to raise; when ``max_seq_len`` is the model's ``positions`` or more, the message names
    those instead, as raising the option cannot help), measured as the episode will render them:
    with ``task_to_env`` and ``parser``, with the tools each environment offers
    (``Environment.offered_tools``; in the system prompt when the template renders no tools).
    Prompts are counted from 1. Not measured:
    prompts the template cannot render (their episodes record a ``template_error``, as a rollout
    without ``check_template`` does) and those of environments that run their own episodes
    (``GeneratingEnvironment``), which write their own prompts."""
    lengths: dict[tuple, tuple[int, Any]] = {}  # the tools are kept: their id is part of the key
    too_long = []
    for n, sample in enumerate(samples, 1):
        env = task_to_env[sample.task_name] if task_to_env is not None else None
        if isinstance(env, GeneratingEnvironment):
            continue
        tools = (env.offered_tools(sample) if env is not None else None) or ()
        key = (tuple((m.role, m.content, m.name) for m in sample.prompt), id(tools))
        if key not in lengths:
            try:
                if tools:
                    ids = renderer.prompt_ids(*renderer.with_tool_prompt(sample.prompt, tools, parser))
                else:
                    ids = renderer.prompt_ids(sample.prompt)
            except TemplateError:  # left to its episode, where it is the policy's template_error
                ids = []
            lengths[key] = (len(ids) + len(renderer.generation_prompt), tools)
        if lengths[key][0] >= max_seq_len:
            too_long.append((n, lengths[key][0], bool(tools)))
    if too_long:
        n, length, with_tools = too_long[0]
        prompt = f"prompt {n} is already {length} tokens{' with the description of its tools' if with_tools else ''}"
        others = f" (and {len(too_long) - 1} more prompts)" if len(too_long) > 1 else ""
        if positions is not None and max_seq_len >= positions:
            raise ConfigError(
                f"the model handles at most {positions} positions but {prompt}{others}; shorten the prompts "
                "or use a model with a longer context"
            )
        raise ConfigError(
            f"{setting}={max_seq_len} leaves no room to generate: {prompt}{others}; raise {setting} or shorten the prompts"
        )


#: Keys of a model's ``config.json`` that give its positions, in the order they are read.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def model_positions(model: str) -> int | None:
    """The positions (prompt plus generated tokens) the model ``model`` handles, read from its
    ``config.json`` (a vision-language model's ``text_config``) without loading it; None when it
    has none or says nothing (an adapter directory alone)."""
    from ..models import resolve_model  # here: ``models`` imports torch, which an engine worker never needs

    path = resolve_model(model) / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # loading the model names what is wrong with it
    for section in (config, config.get("text_config") or {}):
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def fit_max_seq_len(max_seq_len: int | None, positions: int | None, setting: str, default: int) -> int:
    """``max_seq_len`` as given, refused in one line when it is more than the model's ``positions``;
    not given (None), ``default`` lowered to the positions."""
    if max_seq_len is None:
        return default if positions is None else min(default, positions)
    if positions is not None and max_seq_len > positions:
        raise ConfigError(
            f"{setting}={max_seq_len} is more than the {positions} positions the model handles; "
            f"set {setting} to at most {positions}"
        )
    return max_seq_len


def sessions_needed(
    samples: Sequence[Sample], task_to_env: Mapping[str, Environment], config: RolloutConfig
) -> dict[int, int]:
    """Per environment object (by id): how many of its sessions may run at once."""
    counts = Counter(id(task_to_env[s.task_name]) for s in samples)
    return {env_id: min(count, config.concurrency) for env_id, count in counts.items()}


def check_backend_takes_images(
    samples: Sequence[Sample], task_to_env: Mapping[str, Environment], backend: Backend
) -> None:
    """An environment that declares ``produces_images`` needs a backend with ``accepts_images``;
    the refusal gives the backend's ``images_missing`` (why it takes none) where it has one."""
    if backend.accepts_images:
        return
    why = f": {backend.images_missing}" if backend.images_missing else ""
    for task in sorted({s.task_name for s in samples}):
        if task_to_env[task].produces_images:
            raise ConfigError(
                f"the environment for task {task!r} may return images (produces_images=True) but the "
                f"backend {type(backend).__name__} is text-only (accepts_images=False{why}); use a backend for "
                "a vision-language model, or an environment that returns text"
            )


def check_capacity(task_to_env: Mapping[str, Environment], needed: Mapping[int, int], why: str) -> None:
    """Environments that cap their sessions (remote servers) must allow as many as ``needed`` (by
    environment id) says can run at once (``why``: what sets that, for the message); tasks that
    share one environment object share its sessions."""
    tasks: dict[int, list[str]] = {}
    for name, env in task_to_env.items():
        tasks.setdefault(id(env), []).append(name)
    for env_id, sessions in needed.items():
        task = tasks[env_id][0] if len(tasks[env_id]) == 1 else tasks[env_id]
        limit = task_to_env[tasks[env_id][0]].max_sessions
        if limit is not None and limit < sessions:
            raise ConfigError(
                f"environment for task {task!r} allows {limit} concurrent sessions but the rollout "
                f"needs {sessions} ({why}); lower the concurrency or raise the environment's "
                "max_concurrent_envs / max_sessions"
            )


def check_environments(task_to_env: Mapping[str, Environment]) -> None:
    """The engine asks environments only what their base class declares."""
    for task, env in task_to_env.items():
        if not isinstance(env, Environment):
            raise ConfigError(
                f"the environment for task {task!r} is a {type(env).__name__}, not a rollforge Environment; "
                "wrap an environment class with FactoryEnvironment, a step-style object with "
                "StepwiseEnvironment, or subclass rollforge.envs.base.Environment"
            )


def check_backend(backend: Backend) -> None:
    """The engine asks a backend only what its base class declares."""
    if not isinstance(backend, Backend):
        raise ConfigError(
            f"the backend is a {type(backend).__name__}, not a rollforge Backend; subclass "
            "rollforge.backends.base.Backend (generate(prompt_ids, params) -> Completion)"
        )
