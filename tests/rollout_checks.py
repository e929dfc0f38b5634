"""Checks shared by the backend tests: a rollout through a backend is token-exact.

``RecordingBackend`` wraps any backend and keeps every (prompt ids, completion) pair it returned;
``assert_token_exact`` then checks, for every trajectory, that each completion sits in the
trajectory right after its prompt, with mask 1 and the backend's own logprobs, and that the
trajectory decodes to what the chat template renders for its messages.
"""

from __future__ import annotations

import socket
from typing import Any, Sequence

from rollforge.backends.base import Backend, BackendWrapper, SamplingParams
from rollforge.chat.render import ChatRenderer, token_fidelity_gap
from rollforge.types import Completion, Sample, Trajectory


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordingBackend(BackendWrapper):
    """The wrapped backend (which a fixture closes), keeping every (prompt ids, completion) pair."""

    def __init__(self, inner: Backend):
        super().__init__(inner)
        self.calls: list[tuple[tuple[int, ...], Completion]] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, **kwargs: Any) -> Completion:
        completion = await self.inner.generate(prompt_ids, params, **kwargs)
        self.calls.append((tuple(prompt_ids), completion))
        return completion


def chat_samples(n: int) -> list[Sample]:
    questions = ["What is 2 + 3?", "Name a colour.", "Say hello.", "What is 10 - 4?", "Count to three."]
    return [Sample(prompt=[{"role": "user", "content": questions[i % len(questions)]}]) for i in range(n)]


def assert_token_exact(trajectories: Sequence[Trajectory], calls, renderer: ChatRenderer) -> int:
    """Every trajectory is faithful, each of its turns is one recorded completion kept exactly
    (ids, mask 1, the backend's logprobs) right after its prompt, and every recorded completion
    belongs to some trajectory. Returns the number of turns matched."""
    matched = 0
    used: set[int] = set()
    for t in trajectories:
        assert t.error is None, (t.index, t.error)
        assert token_fidelity_gap(t, renderer) is None, (t.index, token_fidelity_gap(t, renderer))
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        mine = {}
        for k, (prompt, completion) in enumerate(calls):
            n, end = len(prompt), len(prompt) + len(completion.token_ids)
            if t.token_ids[:n] == prompt and t.token_ids[n:end] == completion.token_ids:
                mine.setdefault((prompt, completion), k)  # identical requests of twin episodes count once
        assert len(mine) == t.turns, (t.index, len(mine), t.turns)
        for (prompt, completion), k in mine.items():
            n, end = len(prompt), len(prompt) + len(completion.token_ids)
            assert t.loss_mask[n:end] == (1,) * len(completion.token_ids)
            assert t.logprobs[n:end] == completion.logprobs
            used.add(k)
        assert sum(t.loss_mask) == sum(len(c.token_ids) for _, c in mine)
        matched += len(mine)
    unmatched = [k for k, (p, c) in enumerate(calls) if k not in used and (p, c) not in {calls[u] for u in used}]
    assert not unmatched, f"{len(unmatched)} completions belong to no trajectory"
    return matched
