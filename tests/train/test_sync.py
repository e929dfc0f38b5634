"""Weight sync after an update (rollforge.train.sync): decided by what the backend declares."""

from __future__ import annotations

import pytest

from rollforge.backends.base import Backend
from rollforge.errors import ConfigError
from rollforge.train.sync import WeightSync
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
    sync = WeightSync(backend, model)
    await sync.push(model)
    assert sync.shared and backend.invalidated == 1 and sync.syncs == 0


async def test_a_syncing_backend_gets_the_weights_after_every_update():
    model, backend = object(), Syncs()
    assert backend.syncs_weights and not Plain().syncs_weights
    sync = WeightSync(backend, model)
    await sync.push(model)
    await sync.push(model)
    assert backend.models == [model, model] and sync.syncs == 2 and backend.weight_version == 2


def test_a_backend_that_can_do_neither_is_refused_before_training():
    with pytest.raises(ConfigError, match="Plain neither generates with the trained model object nor has update_weights"):
        WeightSync(Plain(), object())
    with pytest.raises(ConfigError):
        WeightSync(SharesModel(object()), object())  # a different model object is not shared
