"""The wire format of the OpenAI-compatible backend: request bodies and response parsing, no I/O.

Requests ask vLLM's ``/v1/completions`` for token-in/token-out: the prompt as token ids,
``return_token_ids`` (the sampled ids come back as ``choices[0].token_ids``), ``logprobs: 0`` (the
logprob of each sampled token), stop strings kept in the output and special tokens kept in the
text they are matched on. Responses are validated field by field; anything missing or malformed is
a ``BackendError`` that says what was wrong, never a guess.

A request with images goes to vLLM's token-in/token-out ``/inference/v1/generate`` instead (the
completions API carries no images): the same sampling options, the token ids with one placeholder per
image, the images as ``image_url`` content parts, and ``return_token_ids`` so that the prompt the
server ran after expanding the images comes back to be checked.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..errors import BackendError
from ..types import FINISH_REASONS, Completion
from .base import SamplingParams


def completion_request(ids: list[int], params: SamplingParams, seed: int, model: str | None) -> dict[str, Any]:
    """The ``/v1/completions`` body of one generation request."""
    body: dict[str, Any] = {"prompt": ids, **_sampling(params, seed), "return_token_ids": True, "stream": False}
    if model is not None:
        body["model"] = model
    return body


def generate_request(
    ids: list[int], image_urls: Sequence[str], params: SamplingParams, seed: int, model: str | None
) -> dict[str, Any]:
    """The ``/inference/v1/generate`` body of one request with images (``ids``: one placeholder each)."""
    body: dict[str, Any] = {
        "token_ids": ids,
        "content_parts": [{"type": "image_url", "url": url} for url in image_urls],
        "sampling_params": _sampling(params, seed),
        "return_token_ids": True,
    }
    if model is not None:
        body["model"] = model
    return body


def _sampling(params: SamplingParams, seed: int) -> dict[str, Any]:
    """vLLM's sampling options of one request: one sample, the sampled token's logprob, stop strings
    kept in the output, special tokens kept in the text that stop strings are matched on."""
    return {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": seed,
        "stop": list(params.stop),
        "stop_token_ids": [t for t in params.stop_token_ids if t >= 0],  # never sampled; vLLM rejects it
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "logprobs": 0,
        "n": 1,
    }


def scoring_request(ids: list[int], model: str | None) -> dict[str, Any]:
    """A body that returns the logprob of every prompt token (``prompt_logprobs``)."""
    body: dict[str, Any] = {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
    if model is not None:
        body["model"] = model
    return body


def prompt_logprobs_from_response(payload: Any, ids: Sequence[int], base_url: str) -> tuple[float | None, ...]:
    try:
        positions = payload["choices"][0]["prompt_logprobs"]
        return tuple(None if p is None else float(p[str(t)]["logprob"]) for p, t in zip(positions, ids, strict=True))
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendError(f"malformed scoring response from {base_url}: {exc!r}") from exc


def completion_from_response(payload: Any, base_url: str = "the server") -> Completion:
    """A ``Completion`` from a ``/v1/completions`` JSON body requested with token ids and logprobs."""
    try:
        choice = payload["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise BackendError(
            f"malformed response from {base_url}: no choices[0] in {excerpt(json.dumps(payload)[:300])}"
        ) from None
    if not isinstance(choice, Mapping):
        raise BackendError(f"malformed response from {base_url}: choices[0] is {type(choice).__name__}, not an object")
    ids = choice.get("token_ids")
    if ids is None:
        raise BackendError(
            f"the server at {base_url} returned no token ids (choices[0].token_ids): it does not support "
            "`return_token_ids` (vLLM >= 0.10.2 does); rollforge needs the exact generated ids"
        )
    logprob_block = choice.get("logprobs")
    logprobs = logprob_block.get("token_logprobs") if isinstance(logprob_block, Mapping) else None
    if logprobs is None:
        raise BackendError(f"malformed response from {base_url}: choices[0].logprobs.token_logprobs is missing")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise BackendError(
            f"malformed response from {base_url}: token_ids is not a list of integers: {excerpt(repr(ids))}"
        )
    if not isinstance(logprobs, list) or not all(_is_number(x) for x in logprobs):
        raise BackendError(
            f"malformed response from {base_url}: token_logprobs is not a list of numbers: {excerpt(repr(logprobs))}"
        )
    if len(ids) != len(logprobs):
        raise BackendError(f"malformed response from {base_url}: {len(ids)} token ids but {len(logprobs)} logprobs")
    reason = choice.get("finish_reason") if choice.get("finish_reason") in FINISH_REASONS else None
    if reason is None:
        raise BackendError(
            f"the server at {base_url} ended the request with finish_reason {choice.get('finish_reason')!r}"
        )
    return Completion(token_ids=tuple(ids), logprobs=tuple(float(x) for x in logprobs), finish_reason=reason)


def completion_from_generate(payload: Any, base_url: str) -> tuple[Completion, Any]:
    """A ``Completion`` and the prompt ids the server ran, from an ``/inference/v1/generate`` body
    (logprobs as ``choices[0].logprobs.content[i].logprob``; the rest as in ``/v1/completions``)."""
    try:
        choice = payload["choices"][0]
        logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    except (KeyError, IndexError, TypeError) as exc:
        raise BackendError(f"malformed response from {base_url}: no choices[0].logprobs.content ({exc!r})") from None
    shaped = {"choices": [{**choice, "logprobs": {"token_logprobs": logprobs}}]}
    return completion_from_response(shaped, base_url), payload.get("prompt_token_ids")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def server_message(text: str) -> str:
    """The ``error.message`` (or ``detail``) of an error body, else an excerpt of the body."""
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return excerpt(text)
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if key in body:
                return excerpt(str(body[key]))
    return excerpt(text)


def excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
