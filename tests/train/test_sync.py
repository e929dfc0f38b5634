"""Weight sync after an update (rollforge.train.sync): decided by what the backend declares."""

from __future__ import annotations

import pytest

from rollforge.backends.base import Backend
from rollforge.errors import BackendError, ConfigError
from rollforge.train.sync import PolicySync
from rollforge.types import Completion


class Plain(Backend):
    async def generate(self, prompt_ids, params):
        return Completion((), (), "stop")


class SharesModel(Plain):
    def __init__(self, model):
        self.model, self.invalidated = model, 0

    def shares_model(self, model):
        return self.model is model

    def invalidate_cache(self):
        self.invalidated += 1


class Syncs(Plain):
    def __init__(self):
        self.weight_version, self.models = 0, []

    async def update_weights(self, model):
        self.models.append(model)
        self.weight_version += 1


async def test_a_backend_sharing_the_model_only_forgets_its_caches():
    model = object()
    backend = SharesModel(model)
    sync = PolicySync(backend, model)
    await sync.push(model)
    assert sync.shared and backend.invalidated == 1 and sync.syncs == 0


async def test_a_syncing_backend_gets_the_weights_after_every_update():
    model, backend = object(), Syncs()
    assert backend.syncs_weights and not Plain().syncs_weights
    sync = PolicySync(backend, model)
    await sync.push(model)
    await sync.push(model)
    assert backend.models == [model, model] and sync.syncs == 2 and backend.weight_version == 2


def test_a_backend_that_can_do_neither_is_refused_before_training():
    with pytest.raises(
        ConfigError, match="Plain neither generates with the trained model object nor has update_weights"
    ):
        PolicySync(Plain(), object())
    with pytest.raises(ConfigError):
        PolicySync(SharesModel(object()), object())  # a different model object is not shared


class Sleeps(Syncs):
    """A colocated engine: records sleep, wake-ups and weight loads in order; refuses requests asleep."""

    def __init__(self):
        super().__init__()
        self.log, self.asleep = [], set()

    @property
    def supports_sleep(self):
        return True

    async def generate(self, prompt_ids, params):
        if self.asleep:
            raise BackendError("asleep")
        self.log.append("generate")
        return await super().generate(prompt_ids, params)

    async def sleep(self):
        self.log.append("sleep")
        self.asleep = {"weights", "kv_cache"}

    async def wake_up(self, tags=None):
        self.log.append(f"wake_up {' '.join(tags)}")
        self.asleep -= set(tags)

    async def update_weights(self, model):
        assert "weights" not in self.asleep, "weights loaded into a sleeping engine"
        self.log.append("update_weights")
        await super().update_weights(model)


async def test_a_colocated_backend_sleeps_through_the_update_and_wakes_weights_before_loading():
    model, backend = object(), Sleeps()
    sync = PolicySync(backend, model)
    assert sync.sleeps and not sync.asleep
    for step in range(2):  # what the trainer's step does: rollout, release, update, push
        await backend.generate([1], None)
        await sync.release()
        backend.log.append("update")
        with pytest.raises(BackendError):
            await backend.generate([1], None)  # no generation while asleep
        await sync.push(model)
    once = ["generate", "sleep", "update", "wake_up weights", "update_weights", "wake_up kv_cache"]
    assert backend.log == once * 2
    assert sync.syncs == 2 and backend.weight_version == 2 and not backend.asleep


async def test_release_does_nothing_for_backends_without_sleep_mode():
    model = object()
    shared, syncing = SharesModel(model), Syncs()
    for backend in (shared, syncing):
        sync = PolicySync(backend, model)
        await sync.release()
        assert not sync.sleeps and not sync.asleep
        await sync.push(model)
    assert shared.invalidated == 1 and syncing.models == [model]
    with pytest.raises(BackendError, match="Syncs has no sleep mode"):
        await syncing.sleep()
    with pytest.raises(BackendError, match="Syncs has no sleep mode"):
        await syncing.wake_up()
