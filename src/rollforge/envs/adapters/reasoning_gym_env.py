"""reasoning-gym datasets as single-turn step-style environments, scored by the library itself.

``samples(dataset, n, seed)`` draws ``n`` entries of ``reasoning_gym.create_dataset(dataset,
size=n, seed=seed)``; each sample's metadata holds the dataset name and the whole entry (question,
answer, metadata), so scoring needs nothing else. The prompt is reasoning-gym's own default
system prompt (answer inside ``<answer>...</answer>``) and the question.

``ReasoningGymEnv.step`` reads the last assistant message, extracts the answer with
``reasoning_gym.utils.extract_answer`` (None when the tags are missing, which scores 0.0, as in
reasoning-gym's own evaluation) and scores it with the dataset's ``score_answer(answer, entry)``.
Every episode is one turn: the step terminates with that score as the reward and no observation.
A scorer that raises scores 0.0 and records ``score_error`` in the metadata.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ...errors import require
from ...types import Message, Sample
from . import unknown_item
from ..stepwise import StepwiseEnvironment, StepwiseReturn

EXTRA = "reasoning-gym"
FAMILY = "reasoning_gym"


def _rg() -> Any:
    return require("reasoning_gym", EXTRA, "the reasoning_gym environments")


def dataset_names() -> tuple[str, ...]:
    require("reasoning_gym", EXTRA, "the reasoning_gym environments")
    from reasoning_gym.factory import DATASETS

    return tuple(sorted(DATASETS))


def check_dataset(dataset: str) -> None:
    """A ``ConfigError`` listing the valid names unless ``dataset`` is a reasoning-gym dataset."""
    names = dataset_names()
    if dataset not in names:
        raise unknown_item("reasoning_gym dataset", dataset, names)


@functools.lru_cache(maxsize=None)
def _scorer(dataset: str) -> Callable[[str | None, dict[str, Any]], float]:
    return _rg().get_score_answer_fn(dataset)


class ReasoningGymEnv:
    """Scores one answer per sample; metadata: ``{"dataset": name, "entry": entry}``."""

    def step(self, message_logs: list[list[dict]], metadata: list[Any]) -> StepwiseReturn:
        from reasoning_gym.utils import extract_answer

        rewards, new_metadata = [], []
        for log, info in zip(message_logs, metadata):
            reply = next((m["content"] for m in reversed(log) if m["role"] == "assistant"), "")
            answer = extract_answer(reply)
            info = {**info, "extracted_answer": answer}
            try:
                reward = float(_scorer(info["dataset"])(answer, info["entry"]))
            except Exception as exc:  # a scorer bug fails the answer, not the batch
                reward = 0.0
                info["score_error"] = f"{type(exc).__name__}: {exc}"
            rewards.append(reward)
            new_metadata.append(info)
        return StepwiseReturn.final(rewards, new_metadata)


def build(dataset: str) -> StepwiseEnvironment:
    check_dataset(dataset)
    return StepwiseEnvironment(ReasoningGymEnv())


def samples(dataset: str, n: int, seed: int) -> list[Sample]:
    check_dataset(dataset)
    if n < 1:
        return []
    from reasoning_gym.utils import SYSTEM_PROMPTS

    data = _rg().create_dataset(dataset, size=n, seed=seed)
    out = []
    for index in range(n):
        entry = dict(data[index])
        prompt = (Message("system", SYSTEM_PROMPTS["default"]), Message("user", entry["question"]))
        metadata = {"dataset": dataset, "entry": entry}
        out.append(Sample(prompt=prompt, task_name=f"{FAMILY}:{dataset}", row={"metadata": metadata}))
    return out
