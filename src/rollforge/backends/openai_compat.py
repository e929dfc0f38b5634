"""OpenAI-compatible backend: token-in/token-out generation from a served model over HTTP.

Design:

- One ``POST /v1/completions`` per request, with the prompt as token ids (the API's ``prompt:
  [int, ...]`` form) and vLLM's token-id options: ``return_token_ids`` (the sampled ids come back
  as ``choices[0].token_ids``), ``logprobs: 0`` (the logprob of each sampled token),
  ``include_stop_str_in_output`` and ``skip_special_tokens: false``. Nothing is re-tokenized: a
  response without ``token_ids`` is an error that names the missing option, never a fallback to
  text (chat completions would lose exactness, so they are not used at all). Logprobs are those of
  the raw model distribution when the server runs with vLLM's default ``--logprobs-mode
  raw_logprobs``; rollforge cannot check that from outside. Bodies and parsing, which do no I/O,
  live in ``openai_wire``. Servers: vLLM (>= 0.10.2 for ``return_token_ids``); another server
  (SGLang) works when it honours the same options, and one that returns no token ids is refused
  with that reason.
- Images (``accepts_images``, given the served model's ``processor``): a request with images goes
  to vLLM's token-in/token-out ``/inference/v1/generate`` (served with ``--enable-scale-out``), the
  images as ``image_url`` content parts and each image's expanded tokens collapsed to the one
  placeholder the server expands itself; the prompt the server ran must equal the renderer's ids,
  else the request fails (``vllm_images``). Without a processor ``images_missing`` says so.
- Transport: one ``httpx.AsyncClient`` (connection pooling, keep-alive) per event loop, since an
  asyncio client cannot outlive its loop and a trainer runs one loop per step. At most
  ``max_concurrency`` requests are in flight; the rest wait for a slot.
- Failures, each bounded: a connection that cannot be made, or a 408/429/5xx answer, is retried
  ``max_retries`` times with exponential backoff and jitter; a request without an answer within
  ``request_timeout`` fails at once (retrying would double the load that made it slow); any other
  HTTP error, or a malformed body, fails at once with the server's message. Every failure is a
  ``BackendError`` for that request only, so only its episode fails.
- Weight sync (``update_weights``, the ``WeightSync`` protocol) drives vLLM's dev-mode endpoints
  (the server runs with ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls
  rollforge.backends.vllm_worker.WeightSyncExtension``, and can read ``weights_dir``): the weights
  are written as safetensors, then ``/pause?mode=wait``, ``/collective_rpc``
  (``rollforge_reload_weights``), ``/reset_prefix_cache``, ``/update_weight_version`` with a
  version token unique to this backend, and ``/resume``. From then on the backend compares the
  server's ``/weight_info`` with that token (at most every ``version_check_interval`` seconds)
  and fails requests while they differ: a server restarted or updated by someone else is
  detected instead of being silently trained on.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import BackendError, ConfigError, require
from ..types import Completion
from .base import Backend, SamplingParams
from .openai_wire import (
    completion_from_generate,
    completion_from_response,
    completion_request,
    excerpt,
    generate_request,
    prompt_logprobs_from_response,
    scoring_request,
    server_message,
)
from .settings import OpenAICompatSettings
from .vllm_images import VLLMImages, image_url
from .weights import export_weights, scratch_directory

# completion_from_response is re-exported: callers and tests import it from here.
__all__ = ["OpenAICompatBackend", "TRANSIENT_STATUSES", "check_server", "completion_from_response"]

#: HTTP statuses worth retrying: the server is busy or briefly unavailable.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_SYNC_HELP = (
    "start `vllm serve` with VLLM_SERVER_DEV_MODE=1 and "
    "--worker-extension-cls rollforge.backends.vllm_worker.WeightSyncExtension"
)


class OpenAICompatBackend(Backend):
    """Generation from an OpenAI-compatible server that returns token ids (see the module docstring).

    - ``base_url``: the server, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted).
    - ``settings`` (``OpenAICompatSettings``): the served model name, API key, concurrency,
      timeouts, retries and their backoff, the seed of requests without one, where synced weights
      are written and how often the server's weight version is checked.
    - ``processor``: the served model's processor (``models.load_processor``), for a
      vision-language model whose requests carry images; None: text only.
    """

    def __init__(self, base_url: str, settings: OpenAICompatSettings = OpenAICompatSettings(), processor: Any = None):
        self._httpx = require("httpx", "openai", "the OpenAI-compatible backend")
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000, got {base_url!r}")
        url = base_url.rstrip("/")
        self.base_url = url[: -len("/v1")] if url.endswith("/v1") else url
        self.settings = settings
        self.model = settings.model
        self.max_concurrency = settings.max_concurrency
        self.request_timeout = settings.request_timeout
        self.max_retries = settings.max_retries
        self.weight_version = 0
        self._headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._timeout = self._httpx.Timeout(settings.request_timeout, connect=settings.connect_timeout)
        self._backoff = (settings.backoff, settings.max_backoff)
        self._seeds = random.Random(settings.seed)
        self._jitter = random.Random(settings.seed)
        self._weights_dir = Path(settings.weights_dir) if settings.weights_dir is not None else None
        self._owns_weights_dir = settings.weights_dir is None
        self._version_token: str | None = None  # what the server must report once we have synced
        self._version_checked_at = float("-inf")
        self.version_check_interval = settings.version_check_interval
        self._instance = uuid.uuid4().hex[:8]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None
        self._slots: asyncio.Semaphore | None = None
        self._version_lock: asyncio.Lock | None = None
        self._closed = False
        self._images = VLLMImages(processor) if processor is not None else None
        #: Whether requests may carry images (the served model's processor was given).
        self.accepts_images = self._images is not None
        #: Why this backend takes no images, else None.
        self.images_missing = (
            None
            if self._images is not None
            else "no processor of the served model was given (OpenAICompatBackend(..., processor=)) to send images with"
        )

    # --- the Backend protocol ----------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: Sequence[Any] = ()
    ) -> Completion:
        if self._closed:
            raise BackendError("the OpenAI-compatible backend is closed")
        ids = [int(i) for i in prompt_ids]
        if not ids:
            raise BackendError("empty prompt: the server needs at least one prompt token")
        if images and self._images is None:
            raise BackendError(f"the OpenAI-compatible backend takes no images: {self.images_missing}")
        if self._version_token is not None:
            await self._check_version()
        seed = params.seed if params.seed is not None else self._seeds.randrange(2**31)
        if images:
            return await self._generate_with_images(self._images, ids, tuple(images), params, seed)
        body = completion_request(ids, params, seed, self.model)
        payload = await self._request("POST", "/v1/completions", json_body=body)
        return completion_from_response(payload, self.base_url)

    async def _generate_with_images(
        self, prompts: VLLMImages, ids: list[int], images: tuple[Any, ...], params: SamplingParams, seed: int
    ) -> Completion:
        """One request with images through ``/inference/v1/generate`` (see the module docstring)."""
        collapsed = await asyncio.to_thread(prompts.collapsed, ids, images)
        urls = await asyncio.to_thread(lambda: [image_url(image) for image in images])
        body = generate_request(collapsed, urls, params, seed, self.model)
        try:
            payload = await self._request("POST", "/inference/v1/generate", json_body=body)
        except BackendError as exc:
            if "HTTP 404" in str(exc):
                raise BackendError(f"{exc} (requests with images need vLLM's /inference/v1/generate)") from exc
            raise
        completion, consumed = completion_from_generate(payload, self.base_url)
        VLLMImages.check_consumed(ids, consumed, f"{payload.get('request_id')} at {self.base_url}")
        return completion

    async def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()
        if self._owns_weights_dir and self._weights_dir is not None:
            shutil.rmtree(self._weights_dir, ignore_errors=True)

    async def score(self, token_ids: Sequence[int]) -> tuple[float | None, ...]:
        """The logprob of each token given those before it (None for the first), computed by the
        server's current weights (vLLM's ``prompt_logprobs``)."""
        ids = [int(i) for i in token_ids]
        if len(ids) < 2:
            raise BackendError(f"score needs at least two tokens, got {len(ids)}")
        if self._version_token is not None:
            await self._check_version()
        body = scoring_request(ids, self.model)
        payload = await self._request("POST", "/v1/completions", json_body=body, what="scoring")
        return prompt_logprobs_from_response(payload, ids, self.base_url)

    def check_reachable(self) -> None:
        """Raise ``BackendError`` naming the URL when no server answers there (any HTTP answer
        counts: this checks that a server is up, not what it serves). Commands call it once at
        start, so a server that is down fails the command instead of every episode."""
        check_server(self.base_url, self._timeout.connect, self._headers)

    # --- the WeightSync protocol -------------------------------------------------------------

    async def update_weights(self, model: Any) -> None:
        """Load ``model``'s weights into the server (see the module docstring)."""
        if self._closed:
            raise BackendError("the OpenAI-compatible backend is closed")
        version = self.weight_version + 1
        token = f"rollforge-{self._instance}-{version}"
        if self._weights_dir is None:
            self._weights_dir = scratch_directory("rollforge-weights-")
        directory = self._weights_dir / f"v{version}"
        try:
            await asyncio.to_thread(export_weights, model, directory)
            await self._admin("/pause", params={"mode": "wait"})
            try:
                await self._admin(
                    "/collective_rpc",
                    body={"method": "rollforge_reload_weights", "kwargs": {"weights_path": str(directory)}},
                )
                await self._admin("/reset_prefix_cache")
                await self._admin("/update_weight_version", body={"new_version": token})
            finally:
                await self._admin("/resume")
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self.weight_version = version
        self._version_token = token
        self._version_checked_at = float("-inf")
        await self._check_version()

    async def server_weight_version(self) -> str | None:
        """The weight version the server reports (``GET /weight_info``; needs dev mode)."""
        payload = await self._request("GET", "/weight_info", what="the weight version")
        if not isinstance(payload, Mapping) or "weight_version" not in payload:
            raise BackendError(f"{self.base_url}/weight_info returned {payload!r}, expected {{'weight_version': ...}}")
        return payload["weight_version"]

    async def _check_version(self) -> None:
        if time.monotonic() - self._version_checked_at < self.version_check_interval:
            return
        async with self._session()[2]:  # concurrent requests share one check
            if time.monotonic() - self._version_checked_at < self.version_check_interval:
                return
            served = await self.server_weight_version()
            if served != self._version_token:
                raise BackendError(
                    f"stale policy: the server at {self.base_url} serves weight version {served!r}, but this "
                    f"trainer last loaded {self._version_token!r} into it (was it restarted or updated by "
                    f"someone else?); call update_weights again"
                )
            self._version_checked_at = time.monotonic()

    async def _admin(self, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        try:
            return await self._request("POST", path, json_body=body, params=params, what="weight sync")
        except BackendError as exc:
            if "HTTP 404" in str(exc):
                raise BackendError(
                    f"{self.base_url}{path} does not exist, so weights cannot be synced: {_SYNC_HELP}"
                ) from exc
            if path == "/collective_rpc":
                raise BackendError(f"{exc} (is the server started with --worker-extension-cls? {_SYNC_HELP})") from exc
            raise

    # --- transport ---------------------------------------------------------------------------

    def _session(self) -> tuple[Any, asyncio.Semaphore, asyncio.Lock]:
        """This event loop's client, request slots and version-check lock."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._slots is None or self._version_lock is None:
            # A client of a finished loop cannot be closed from this one; dropping it closes its sockets.
            limits = self._httpx.Limits(
                max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency
            )
            self._client = self._httpx.AsyncClient(
                base_url=self.base_url, timeout=self._timeout, limits=limits, headers=self._headers
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)
            self._version_lock = asyncio.Lock()
            self._loop = loop
        return self._client, self._slots, self._version_lock

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        what: str = "generation",
    ) -> Any:
        httpx = self._httpx
        client, slots, _ = self._session()
        url = f"{self.base_url}{path}"
        problem = ""
        async with slots:
            for attempt in range(self.max_retries + 1):
                if attempt:
                    base, cap = self._backoff
                    await asyncio.sleep(min(cap, base * 2 ** (attempt - 1)) * (0.5 + self._jitter.random()))
                try:
                    response = await client.request(method, path, json=json_body, params=params)
                except httpx.TimeoutException as exc:
                    if isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout)):
                        problem = f"could not connect within the timeout ({type(exc).__name__})"
                        continue
                    raise BackendError(
                        f"{what} request to {url} got no response within request_timeout={self.request_timeout} s"
                    ) from exc
                except httpx.TransportError as exc:  # refused, reset, closed mid-response
                    problem = f"{type(exc).__name__}: {exc or 'connection failed'}"
                    continue
                if response.status_code in TRANSIENT_STATUSES:
                    problem = f"HTTP {response.status_code}: {excerpt(response.text)}"
                    continue
                if response.status_code >= 400:
                    raise BackendError(
                        f"{what} request to {url} failed with HTTP {response.status_code}: "
                        f"{server_message(response.text)}"
                    )
                if not response.content:
                    return None
                try:
                    return response.json()
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise BackendError(f"malformed response from {url}: not JSON: {excerpt(response.text)}") from exc
        raise BackendError(f"{what} request to {url} failed after {self.max_retries + 1} attempts; last: {problem}")


def check_server(base_url: str, timeout: float = 10.0, headers: Mapping[str, str] | None = None) -> None:
    """``OpenAICompatBackend.check_reachable`` for a URL, before any backend is built."""
    httpx = require("httpx", "openai", "the OpenAI-compatible backend")
    url = base_url.rstrip("/").removesuffix("/v1")
    try:
        httpx.get(f"{url}/v1/models", headers=dict(headers or {}), timeout=timeout)
    except httpx.TransportError as exc:
        raise BackendError(
            f"no OpenAI-compatible server answers at {url} ({type(exc).__name__}: {exc or 'connection failed'}); "
            "start it, or fix the base URL"
        ) from None
    except httpx.InvalidURL as exc:
        raise ConfigError(f"base URL {base_url!r} is not a valid URL: {exc}") from None
