"""What supervised fine-tuning trains on: token-exact examples with the RL trainer's loss masks.

An ``Example`` is one training sequence: token ids and a loss mask, 1 exactly on tokens the
policy writes (assistant content and its end-of-turn token), 0 on prompt, template, tool and
environment tokens -- the layout of a rollout (``rollout/episode.py``). Examples come from

- trajectories (``trajectories.jsonl`` of a rollout, ``trajectories/step-*.jsonl`` of a training
  run, or ``Trajectory`` objects): their ids and masks are used exactly as rolled out, nothing is
  re-tokenized. An episode is kept when it did not fail and its reward (a training run's
  ``reward``, which includes reward functions, else ``total_reward``) is >= ``min_reward``: that
  filter is rejection sampling;
- conversations (``{"messages": [...]}`` rows of a JSONL file or a ``datasets`` dataset; OpenAI-style
  ``tool_calls`` are written in the model family's call format): rendered
  with ``ChatRenderer`` piece by piece as the engine renders a rollout (prompt, then per assistant
  turn the generation prompt, the content and end-of-turn token as policy tokens, the template's
  closing text, then the following messages), so the ids decode to the template's rendering;
- an environment's expert (``envs/experts.py``): episodes rolled out through the normal engine by
  a ``ScriptedBackend`` whose replies the expert writes, then filtered like trajectories.

Images: under a vision renderer (its ``images``, an ``images.ImageProcessing``), an example whose
ids show images carries them (``Example.images``, a ``train.vision.RowImages``) so that the SFT
forward pass gets their pixels, as the GRPO update's rows do: a trajectory's segment gets them from
``train.vision.with_images`` (a trajectory file's images are read back from its PNG bytes), a
conversation's are its messages' ``images``. The expert's scripted backend takes the images and
ignores them (the expert reads the conversation's pictures itself). Trajectories that hold images
given to a text model are refused: their ids are a vision model's.
"""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..backends.base import CURRENT_EPISODE
from ..backends.scripted import ScriptedBackend, ScriptedRequest
from ..chat.render import ChatRenderer
from ..chat.toolcalls import ToolCallParser, get_parser
from ..envs.experts import format_tool_call
from ..envs.library import get_env_spec
from ..errors import ConfigError, MissingDependency
from ..images import ImageProcessing
from ..rollout.config import RolloutConfig
from ..rollout.engine import RolloutResult, arollout
from ..train.update import UpdateRow
from ..train.vision import RowImages, with_images
from ..types import Message, Trajectory


@dataclass(frozen=True)
class Example:
    """One training sequence; ``mask`` is 1 on the tokens that carry loss."""

    ids: tuple[int, ...]
    mask: tuple[int, ...]
    prompt_length: int = 0
    images: RowImages | None = None  # the images its ids show, in order (a vision model's); None: text only

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.mask):
            raise ConfigError(f"an example has {len(self.ids)} token ids but {len(self.mask)} mask entries")


# -- trajectories ----------------------------------------------------------------------------------


def accepted(reward: float | None, failed: bool, min_reward: float | None) -> bool:
    """The rejection-sampling rule: a failed episode is never kept; otherwise it is kept when no
    threshold is set or its reward is >= ``min_reward``."""
    if failed:
        return False
    return min_reward is None or (reward is not None and reward >= min_reward)


def select_trajectories(
    trajectories: Sequence[Trajectory], min_reward: float | None, rewards: Sequence[float] | None = None
) -> list[Trajectory]:
    """The trajectories that pass ``accepted``; ``rewards`` (one per trajectory, e.g. with reward
    functions added) replaces ``total_reward`` when given."""
    scores = list(rewards) if rewards is not None else [t.total_reward for t in trajectories]
    if len(scores) != len(trajectories):
        raise ConfigError(f"{len(trajectories)} trajectories but {len(scores)} rewards")
    return [t for t, r in zip(trajectories, scores) if accepted(r, t.error is not None, min_reward)]


def trajectory_examples(trajectory: Trajectory, images: ImageProcessing | None = None) -> list[Example]:
    """One example per segment (a template that rewrites history splits an episode into segments,
    each token-exact against its own rendering; see ``Trajectory.segments``), each with the images
    its ids show when ``images`` (a vision renderer's) is given."""
    out = []
    for segment in trajectory.segments:
        row = with_images(UpdateRow.from_segment(segment), images, trajectory, segment)
        ids = tuple(segment.token_ids) if row.images is None else tuple(row.ids.tolist())  # a cut image: padded
        out.append(Example(ids, tuple(segment.loss_mask), segment.prompt_length, row.images))
    return out


def record_reward(record: Mapping[str, Any]) -> float | None:
    """A trajectory record's reward: ``reward`` (training runs: with reward functions), else ``total_reward``."""
    value = record.get("reward", record.get("total_reward"))
    return None if value is None else float(value)


def read_records(pattern: str | Path) -> list[dict[str, Any]]:
    """The trajectory records of every file matching ``pattern`` (a path or a glob), in file order; a
    torn last line of a killed run is skipped."""
    paths = sorted(glob.glob(str(pattern))) if glob.has_magic(str(pattern)) else [str(pattern)]
    if not paths or not all(Path(p).is_file() for p in paths):
        raise ConfigError(f"trajectory file(s) {str(pattern)!r} not found; expected a trajectories.jsonl path or glob")
    out = []
    for path in paths:
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or "token_ids" not in record or "loss_mask" not in record:
                raise ConfigError(f"{path} line {n} is not a trajectory record (needs token_ids and loss_mask)")
            out.append(record)
    return out


def record_examples(
    records: Iterable[Mapping[str, Any]], min_reward: float | None, images: ImageProcessing | None = None
) -> list[Example]:
    """The examples of the accepted ``records``; a record whose messages hold images is read back as
    a ``Trajectory`` and its examples show those images (``images``: the vision renderer's)."""
    out = []
    for n, record in enumerate(records, 1):
        if not accepted(record_reward(record), record.get("error") is not None, min_reward):
            continue
        if any(m.get("images") for m in record.get("messages") or ()):
            if images is None:
                raise ConfigError(
                    f"trajectory record {n} (index {record.get('index')}) shows images, but the model is text-only; "
                    "train a vision-language model on it (one whose directory has a processor_config.json)"
                )
            out += trajectory_examples(Trajectory.from_json(record), images)
            continue
        out += [
            Example(tuple(part["token_ids"]), tuple(part["loss_mask"]), int(part.get("prompt_length", 0)))
            for part in record.get("segments") or (record,)  # one example per segment
        ]
    return out


# -- conversations ---------------------------------------------------------------------------------


def conversation_example(
    renderer: ChatRenderer,
    messages: Sequence[Message | Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] = (),
    parser: ToolCallParser | None = None,
) -> Example:
    """A conversation rendered as a rollout would have produced it; assistant turns carry loss.
    With ``tools``, a template that ignores ``tools=`` gets ``parser``'s tool prompt as a rollout does."""
    parser = parser or get_parser()
    messages = tuple(_message(m, parser) for m in messages)
    first = next((i for i, m in enumerate(messages) if m.role == "assistant"), None)
    if first is None or first == 0:
        where = "no assistant message" if first is None else "an assistant message first"
        raise ConfigError(f"a conversation to train on needs a prompt, then assistant messages; got {where}")
    prompt, template_tools = renderer.with_tool_prompt(messages[:first], tools, parser)
    ids = list(renderer.prompt_ids(prompt, template_tools))
    mask = [0] * len(ids)
    prompt_length = len(ids)
    end = list(renderer.stop_token_ids[:1])
    pending: list[Message] = []
    last_assistant = max(i for i, m in enumerate(messages) if m.role == "assistant")
    for i, message in enumerate(messages[first : last_assistant + 1], first):
        if message.role != "assistant":
            pending.append(message)
            continue
        if pending:
            ids += renderer.delta_ids(pending, template_tools)
            pending = []
        ids += renderer.generation_prompt  # every assistant turn opens with it, as in a rollout
        mask += [0] * (len(ids) - len(mask))
        generated = renderer.encode(message.content) + end
        ids += generated
        mask += [1] * len(generated)
        if i < last_assistant:
            closing = renderer.closing_ids(generated)
            ids += closing
            mask += [0] * len(closing)
    shown = tuple(image for m in messages[: last_assistant + 1] for image in m.images)
    images = RowImages(renderer.images, shown) if shown and renderer.images is not None else None
    return Example(tuple(ids), tuple(mask), prompt_length, images)


def _message(m: Message | Mapping[str, Any], parser: ToolCallParser) -> Message:
    """A dataset message; an assistant message with OpenAI-style ``tool_calls`` (``{"function":
    {"name", "arguments"}}``) gets them written after its content in ``parser``'s call format."""
    calls = m.get("tool_calls") if isinstance(m, Mapping) else None
    if not calls or not all(isinstance(c, Mapping) and isinstance(c.get("function"), Mapping) for c in calls):
        return Message.coerce(m)
    written = []
    for call in calls:
        arguments = call["function"].get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"tool call arguments {arguments!r:.80} are not valid JSON: {exc}") from None
        written.append(format_tool_call(parser, call["function"]["name"], arguments))
    content = "\n".join([m["content"], *written] if m.get("content") else written)
    return Message("assistant", content)


def message_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a conversations file (``.jsonl``/``.json``/``.parquet``) or saved ``datasets`` directory."""
    from ..inputs.data import load_rows

    return load_rows(path)


def row_examples(
    renderer: ChatRenderer,
    rows: Iterable[Mapping[str, Any]],
    column: str = "messages",
    parser: ToolCallParser | None = None,
) -> list[Example]:
    out = []
    for n, row in enumerate(rows, 1):
        if column not in row:
            raise ConfigError(f"conversation row {n} has no {column!r} column (columns: {sorted(row)})")
        try:
            out.append(conversation_example(renderer, row[column], row.get("tools") or (), parser))
        except ConfigError as exc:
            raise ConfigError(f"conversation row {n}: {exc}") from None
    return out


# -- expert demonstrations -----------------------------------------------------------------------


def expert_backend(expert: Any, renderer: ChatRenderer, parser: ToolCallParser) -> ScriptedBackend:
    """A scripted backend whose reply to each request is ``expert(conversation so far, parser)``.
    The conversation is the requesting episode's own (the engine marks each episode's requests).
    Under a vision renderer the backend takes the conversation's images and ignores them: an expert
    reads the pictures from the messages, and an environment that returns them needs a backend that
    declares ``accepts_images``."""

    def script(request: ScriptedRequest) -> str:
        episode = CURRENT_EPISODE.get()
        messages = getattr(episode, "messages", None)
        if messages is None:
            raise ConfigError("expert demonstrations must be rolled out by the rollforge engine")
        return expert(tuple(messages), parser)

    return ScriptedBackend(script, renderer.tokenizer, accepts_images=renderer.images is not None)


async def expert_demonstrations(
    env: str,
    episodes: int,
    renderer: ChatRenderer,
    config: RolloutConfig,
    *,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
) -> RolloutResult:
    """``episodes`` episodes of the bundled environment ``env`` played by its expert, in the
    tool-call format of ``config.tool_parser``."""
    spec = get_env_spec(env)
    if spec.expert is None:
        raise ConfigError(f"environment {env!r} has no expert; environments with one: {environments_with_expert()}")
    parser = renderer.parser(config.tool_parser)
    samples = spec.samples(episodes, seed, **dict(options or {}))
    backend = expert_backend(spec.expert, renderer, parser)
    try:
        return await arollout(samples, {spec.name: spec.build()}, backend, renderer, config)
    finally:
        await backend.close()


def environments_with_expert() -> list[str]:
    from ..envs.library import ENV_NAMES

    names = []
    for name in ENV_NAMES:
        try:
            spec = get_env_spec(name)
        except MissingDependency:  # a family member whose library is absent has no expert either
            continue
        if spec.expert is not None:
            names.append(name)
    return names
