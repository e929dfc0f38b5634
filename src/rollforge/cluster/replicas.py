"""Generation replicas on Ray actors: the engine or model lives on a Ray worker, the driver holds a
``Backend`` proxy. Several of them behind ``backends.router.RouterBackend`` are "replicas".

- ``RayBackendReplica(config)`` starts one async Ray actor (``BackendHost``, reserving the
  config's ``replica_cpus``/``replica_gpus``) that builds its backend with
  ``backends.opening.open_backend(config)`` on the worker: a vLLM engine (``vllm``) or a
  transformers model with dynamic batching (``hf``; each actor loads the model itself).
  ``start_replicas(config)`` starts ``config.replicas`` of them at once and waits until every one
  runs; one that cannot start is named, and all are stopped. ``cluster/generation.py`` puts them
  behind a router.
- ``generate`` is one actor call; the ``Completion`` comes back pickled, and the driver marks it
  with the replica's name and node (``Completion.served_by``: the actor says its node once, in
  the ``ready()`` that tells it started; ``placement``). Cancelling the caller (an episode timeout)
  cancels the actor's task, so the HF batch drops the row and vLLM aborts it.
- Images: ``ready()`` also says whether the actor's backend takes images (``accepts_images``, a
  vision-language model's directory: ``HFVisionBackend``, or vLLM's multimodal inputs) and why
  not (``images_missing``); the replica declares them from then on (``start_replicas`` waits for
  it, so a router built on its replicas knows). A request's images (PIL images or encoded bytes)
  travel pickled with the actor call.
- A replica fills in the hooks ``Backend`` declares for a router: its ``name``, ``dead`` and
  ``share_weights``.
- Weight sync: ``share_weights(model)`` exports the state dict on the driver once
  (``weights.state_dict_for_export``: a peft model merged, tied weights once) and puts it in
  Ray's object store; a router calls it once for all its replicas and each actor fetches it. In
  the actor, the weight gate (``backends/gate.py``) holds new requests and lets those in flight
  finish on the old weights; then an HF replica loads the state dict into its model and forgets
  its prefix cache, a vLLM replica writes it in the export format to a scratch directory and
  reloads from there
  (``VLLMBackend.update_weights_from_directory``). ``weight_version`` counts completed updates.
- Failures: when the actor dies (crash, OOM kill, ``ray.kill``, lost node), the request in flight
  and every later one fail at once with ``BackendError`` naming the replica and Ray's reason, and
  ``dead`` holds that reason, so a router places no new episodes there. An error of the backend
  inside the actor comes back as ``BackendError`` naming the replica.
- ``close`` closes the backend on the actor (bounded by ``close_timeout``), then kills the actor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import time
import weakref
from typing import Any, Sequence

from ..backends.base import Backend, SamplingParams
from ..backends.config import BackendConfig
from ..backends.gate import WeightGate
from ..backends.weights import save_state_dict, scratch_directory, state_dict_for_export
from ..errors import BackendError, ConfigError
from ..placement import Placement
from ..seeds import replica_seed
from ..types import Completion
from .connect import actor_death_reason, import_ray, this_node, worker_runtime_env
from .resources import REPLICA_KNOBS, Demand, check_fits, hold, share_cpus

REPLICA_KINDS = ("hf", "vllm")


class BackendHost:
    """The actor body: one backend built on this worker behind the weight gate."""

    def __init__(self, config: BackendConfig):
        from ..backends.opening import open_backend

        self._kind = config.kind
        self._backend = open_backend(config)
        self._gate = WeightGate()

    async def ready(self) -> tuple[str, str, bool, str | None]:
        """Where this actor runs (``connect.this_node``), once its backend is built, and whether that
        takes images (``accepts_images``, ``images_missing``)."""
        return (*this_node(), self._backend.accepts_images, self._backend.images_missing)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, images: Any = None) -> Completion:
        async with self._gate.request():
            if images is None:
                return await self._backend.generate(prompt_ids, params)
            return await self._backend.generate(prompt_ids, params, images=images)

    async def update_weights(self, state: dict[str, Any]) -> None:
        async with self._gate.update():
            if self._kind == "hf":
                await asyncio.to_thread(load_exported, self._backend.model, state)
                self._backend.invalidate_cache()
            else:
                directory = scratch_directory("rollforge-replica-weights-")
                try:
                    await asyncio.to_thread(save_state_dict, state, directory)
                    await self._backend.update_weights_from_directory(directory)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)

    async def close(self) -> None:
        await self._backend.close()


def load_exported(model: Any, state: dict[str, Any]) -> None:
    """Load a ``state_dict_for_export`` result into ``model`` in place. Keys it lacks must be tied to
    keys it has (an output head sharing the embedding's storage)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {own[name].untyped_storage().data_ptr() for name in state if name in own}
    untied = [name for name in missing if own[name].untyped_storage().data_ptr() not in loaded]
    if unexpected or untied:
        raise BackendError(
            f"the weights do not fit this replica's model: missing {untied[:5]}, unexpected {list(unexpected)[:5]}"
        )


class SharedWeights:
    """A model's exported weights, put once in Ray's object store (``RayBackendReplica.share_weights``)."""

    def __init__(self, ref: Any):
        self.ref = ref


class RayBackendReplica(Backend):
    """A ``Backend`` whose ``config.kind`` backend (``hf`` or ``vllm``) runs on a Ray actor (see the
    module docstring). ``config`` describes this one replica (``replicas == 1``); the actor reserves
    its ``replica_cpus`` (None: 1) and ``replica_gpus``. Ray must already be initialised
    (``cluster.connect.ensure_ray``)."""

    def __init__(self, config: BackendConfig, *, name: str | None = None, close_timeout: float = 120.0):
        if config.kind not in REPLICA_KINDS:
            raise ConfigError(f"a Ray replica runs one of {', '.join(REPLICA_KINDS)}, not {config.kind!r}")
        if config.replicas != 1:
            raise ConfigError(f"one Ray replica runs one backend (replicas=1), got replicas={config.replicas}")
        ray = import_ray()
        if not ray.is_initialized():
            raise ConfigError("Ray is not initialised: call rollforge.cluster.connect.ensure_ray() first")
        self.config = config
        self.kind, self.model = config.kind, config.model
        self.name: str | None = name or f"{config.kind} replica"
        self.close_timeout = close_timeout
        self.weight_version = 0
        self.dead: str | None = None  # why the actor died, once it has (``Backend.dead``)
        options = {
            "num_cpus": 1.0 if config.replica_cpus is None else config.replica_cpus,
            "num_gpus": config.replica_gpus,
            "max_concurrency": 100_000,
            "max_restarts": 0,
            "runtime_env": worker_runtime_env(),
        }
        self.actor = ray.remote(BackendHost).options(**options).remote(config)
        #: The actor's ``ready()`` call: it answers once the backend is built, with the node.
        self.started = self.actor.ready.remote()
        #: Where the actor runs, once it said so (``start_replicas``, or the first completion).
        self.placement: Placement | None = None
        held = Demand(f"{config.kind} replicas", 1, options["num_cpus"], config.replica_gpus, knobs=REPLICA_KNOBS)
        self._release = weakref.finalize(self, hold(held))  # until closed, killed or collected
        self._closed = False

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, images: Any = None) -> Completion:
        self._check_usable()
        ref = self.actor.generate.remote(
            [int(i) for i in prompt_ids], params, None if images is None else tuple(images)
        )
        try:
            completion = await self._call(ref, "generation")
        except asyncio.CancelledError:
            import_ray().cancel(ref)
            raise
        if self.placement is None:
            self.placed(await self._call(self.started, "starting"))
        return dataclasses.replace(completion, served_by=self.placement)

    def placed(self, ready: tuple[str, str, bool, str | None]) -> None:
        """Record ``ready()``'s answer: where the actor runs (node id, IP address), and whether its
        backend takes images."""
        node_id, address, self.accepts_images, self.images_missing = ready
        self.placement = Placement(str(self.name), node_id, address)

    @staticmethod
    def share_weights(model: Any) -> SharedWeights:
        """Export ``model``'s weights once for every Ray replica (``Backend.share_weights``: a router
        calls this once before updating them all)."""
        return SharedWeights(import_ray().put(state_dict_for_export(model)))

    async def update_weights(self, model: Any) -> None:
        """Serve ``model``'s weights (or ``share_weights(model)``) from the next request on."""
        self._check_usable()
        shared = model if isinstance(model, SharedWeights) else await asyncio.to_thread(self.share_weights, model)
        await self._call(self.actor.update_weights.remote(shared.ref), "the weight update")
        self.weight_version += 1

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self.dead is None:
                async with asyncio.timeout(self.close_timeout):
                    await self._call(self.actor.close.remote(), "closing")
        except BackendError:
            if self.dead is None:  # the backend's own close failed; a dead actor has nothing to close
                raise
        except TimeoutError:
            raise BackendError(f"{self.name} did not close within {self.close_timeout} s; it was killed") from None
        finally:
            import_ray().kill(self.actor)
            self._release()

    def _check_usable(self) -> None:
        if self._closed:
            raise BackendError(f"{self.name} is closed")
        if self.dead is not None:
            raise BackendError(f"{self.name} died: {self.dead}")

    async def _call(self, ref: Any, what: str) -> Any:
        ray = import_ray()
        try:
            return await ref
        except ray.exceptions.RayActorError as exc:
            self.dead = actor_death_reason(exc)
            raise BackendError(f"{self.name} died: {self.dead}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            raise BackendError(f"{self.name}: {what} failed: {type(cause).__name__}: {cause}") from None


def start_replicas(config: BackendConfig, *, start_timeout: float = 600.0) -> list[RayBackendReplica]:
    """Start ``config.replicas`` replicas named ``<kind> replica <i>`` (replica ``i`` seeded
    ``seed + i``, so that unseeded requests do not repeat each other's samples) and wait until all
    run. ``config.replica_cpus`` None is sized by ``cluster.resources.share_cpus``."""
    ray = import_ray()
    count = config.replicas
    num_cpus = share_cpus(config.replica_cpus, count)
    check_fits(
        Demand(
            f"{config.kind} replicas",
            count,
            num_cpus,
            gpus=config.replica_gpus,
            knobs=REPLICA_KNOBS,
        )
    )
    replicas: list[RayBackendReplica] = []
    try:
        for i in range(count):
            own = dataclasses.replace(config, replicas=1, replica_cpus=num_cpus, seed=replica_seed(config.seed, i))
            replicas.append(RayBackendReplica(own, name=f"{config.kind} replica {i}"))
        deadline = time.monotonic() + start_timeout
        for replica in replicas:
            try:
                replica.placed(ray.get(replica.started, timeout=max(0.0, deadline - time.monotonic())))
            except ray.exceptions.RayActorError as exc:
                raise BackendError(f"{replica.name} failed to start: {actor_death_reason(exc)}") from None
            except ray.exceptions.GetTimeoutError:
                raise BackendError(
                    f"{replica.name} did not start within {start_timeout} s; does the cluster have the CPUs/GPUs "
                    "each replica reserves?"
                ) from None
    except BaseException:
        for replica in replicas:
            ray.kill(replica.actor)
            replica._release()
        raise
    return replicas
