"""Token exactness, asserted: the checks the backend, engine, family and gateway tests share.

Token-in/token-out means two things a test can check. The ids a backend generated are kept as they
came (same ids, mask 1, the backend's own logprobs, right after the ids it was asked to continue),
and every sequence the model saw is the chat template's rendering of its messages. The shapes:

- ``assert_token_exact(trajectories, calls, renderer)``: trajectories against the requests a
  ``RecordingBackend`` kept (``calls``): each turn is one recorded completion inside one segment,
  every recorded completion belongs to some trajectory, and ``token_fidelity_gap`` finds nothing.
- ``assert_replies_exact(trajectory, renderer, replies)``: a scripted policy's ``replies`` are
  exactly what the loss mask covers (when the test knows the replies, not the requests).
- ``assert_segment_exact(segment, renderer, prompt_messages)``: a gateway ``RecordedSegment`` holds
  the rendering of its messages and its prompt the rendering of the first ``prompt_messages``;
  ``renders_its_messages`` is the same check as a bool, for benchmarks that count.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..chat.fidelity import token_fidelity_gap
from ..chat.render import ChatRenderer
from ..types import Completion, Segment, Trajectory

Call = tuple[tuple[int, ...], Completion]


def generated_ids(record: Any) -> list[int]:
    """The ids under mask 1 of a trajectory or segment, in order."""
    return [token for token, bit in zip(record.token_ids, record.loss_mask) if bit]


def assert_token_exact(trajectories: Sequence[Trajectory], calls: Sequence[Call], renderer: ChatRenderer) -> int:
    """Every trajectory is faithful, each of its turns is one recorded completion kept exactly
    (ids, mask 1, the backend's logprobs) right after its prompt in one of its segments, and every
    recorded completion belongs to some trajectory. Returns the number of turns matched."""
    matched, used = 0, set()
    for t in trajectories:
        assert t.error is None, (t.index, t.error)
        assert token_fidelity_gap(t, renderer) is None, (t.index, token_fidelity_gap(t, renderer))
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        mine = _calls_in(t, calls)
        assert len(mine) == t.turns, (t.index, len(mine), t.turns)
        for (prompt, completion), (k, segment) in mine.items():
            n, end = len(prompt), len(prompt) + len(completion.token_ids)
            assert segment.loss_mask[n:end] == (1,) * (end - n), (t.index, k)
            assert segment.logprobs[n:end] == completion.logprobs, (t.index, k)
            used.add(k)
        assert sum(t.loss_mask) == sum(len(completion.token_ids) for _, completion in mine)
        matched += len(mine)
    kept = {calls[k] for k in used}
    unmatched = [k for k, call in enumerate(calls) if k not in used and call not in kept]
    assert not unmatched, f"{len(unmatched)} completions belong to no trajectory"
    return matched


def _calls_in(trajectory: Trajectory, calls: Sequence[Call]) -> dict[Call, tuple[int, Segment]]:
    """The recorded calls found in ``trajectory``: a segment that opens with the call's prompt and
    continues with its completion. Identical requests of twin episodes count once."""
    mine: dict[Call, tuple[int, Segment]] = {}
    for k, (prompt, completion) in enumerate(calls):
        n, end = len(prompt), len(prompt) + len(completion.token_ids)
        for segment in trajectory.segments:
            if segment.token_ids[:n] == prompt and segment.token_ids[n:end] == completion.token_ids:
                mine.setdefault((prompt, completion), (k, segment))
                break
    return mine


def assert_replies_exact(trajectory: Trajectory, renderer: ChatRenderer, replies: Sequence[str]) -> None:
    """The record re-renders to its own tokens, and the loss mask covers exactly the scripted
    ``replies``, each closed by the end token."""
    assert token_fidelity_gap(trajectory, renderer) is None, token_fidelity_gap(trajectory, renderer)
    end = renderer.decode([renderer.stop_token_ids[0]])
    assert renderer.decode(generated_ids(trajectory)) == "".join(reply + end for reply in replies)


def renders_its_messages(segment: Any, renderer: ChatRenderer) -> bool:
    """A gateway ``RecordedSegment`` holds exactly the template's rendering of its messages, except
    that it ends on the policy's own tokens: the closing text after the last reply may be absent."""
    expected = renderer.conversation_ids(segment.messages, segment.tools)
    ids = list(segment.token_ids)
    rest = expected[len(ids) :]
    return expected[: len(ids)] == ids and rest == renderer.closing[len(renderer.closing) - len(rest) :]


def assert_segment_exact(segment: Any, renderer: ChatRenderer, prompt_messages: int) -> None:
    """``renders_its_messages``, and the segment's prompt (mask 0) is the rendering of its first
    ``prompt_messages`` messages with the generation prompt, followed by a generated token."""
    expected = renderer.conversation_ids(segment.messages, segment.tools)
    ids = list(segment.token_ids)
    assert renders_its_messages(segment, renderer), (renderer.decode(expected), renderer.decode(ids))
    prompt = renderer.conversation_ids(segment.messages[:prompt_messages], segment.tools, add_generation_prompt=True)
    assert segment.prompt_length == len(prompt) and ids[: len(prompt)] == prompt
    assert set(segment.loss_mask[: len(prompt)]) == {0} and segment.loss_mask[len(prompt)] == 1


def assert_faithful(trajectories: Sequence[Trajectory], renderer: ChatRenderer) -> None:
    """Every trajectory renders back to its own token ids (``token_fidelity_gap`` finds no gap) and
    carries one loss-mask entry and one logprob per token."""
    for t in trajectories:
        assert token_fidelity_gap(t, renderer) is None, (t.index, token_fidelity_gap(t, renderer))
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
