"""BackendWrapper forwards every member declared on ``Backend`` and ``WeightSync`` (read from the
classes, so a member declared later fails here until it is forwarded and checked), and the wrappers
built on it (weight versions, the recording backend) keep what the wrapped backend answers."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from rollforge.backends.base import Backend, BackendWrapper, SamplingParams, WeightSync
from rollforge.errors import BackendError, ConfigError
from rollforge.testing import RecordingBackend
from rollforge.train.versions import VersionedBackend
from rollforge.types import Completion

PARAMS = SamplingParams(max_new_tokens=2)


class Probe(Backend):
    """Answers every declared member differently from ``Backend``'s defaults and records each call."""

    accepts_images = True
    name = "probe replica"
    dead = "its actor died"
    images_missing = "its processor is missing"

    def __init__(self):
        self.calls: list[tuple] = []
        self.weight_version = 7

    @staticmethod
    def share_weights(model):
        return ("exported", model)

    async def generate(self, prompt_ids, params, images=None):
        self.calls.append(("generate", tuple(prompt_ids), images))
        return Completion(token_ids=(4,), logprobs=(-0.5,), finish_reason="stop")

    async def close(self):
        self.calls.append(("close",))

    def shares_model(self, model):
        self.calls.append(("shares_model", model))
        return True

    def invalidate_cache(self):
        self.calls.append(("invalidate_cache",))

    @property
    def supports_sleep(self):
        return True

    async def sleep(self):
        self.calls.append(("sleep",))

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    async def update_weights(self, model):
        self.calls.append(("update_weights", model))
        self.weight_version += 1

    def reopener(self):
        return Probe


class Plain(Backend):
    """Only ``generate``: every other member is ``Backend``'s default."""

    async def generate(self, prompt_ids, params):
        raise AssertionError("not called")


def declared(cls) -> set[str]:
    """The public members ``cls`` declares (methods, properties, attributes, annotations)."""
    names = {name for name in vars(cls) if not name.startswith("_")}
    return names | {name for name in getattr(cls, "__annotations__", {}) if not name.startswith("_")}


MEMBERS = declared(Backend) | declared(WeightSync)


async def check_member(name: str, wrapper: Backend, probe: Probe) -> None:
    """Ask ``wrapper`` for ``name`` and assert it gave the probe's answer (``close``: that it did not
    close the probe, which belongs to whoever opened it)."""
    probe.calls.clear()
    model = object()
    if name == "generate":
        assert (await wrapper.generate([1, 2], PARAMS, images=["img"])).token_ids == (4,)
        assert probe.calls == [("generate", (1, 2), ["img"])]
    elif name == "close":
        await wrapper.close()
        assert probe.calls == []
    elif name == "shares_model":
        assert wrapper.shares_model(model) is True and probe.calls == [("shares_model", model)]
    elif name == "update_weights":
        before = probe.weight_version
        await wrapper.update_weights(model)
        assert probe.calls == [("update_weights", model)] and probe.weight_version == before + 1
    elif name in ("sleep", "invalidate_cache"):
        result = getattr(wrapper, name)()
        if inspect.isawaitable(result):
            await result
        assert probe.calls == [(name,)]
    elif name == "reopener":  # never forwarded: workers reopening the inner backend would bypass the wrapper
        assert probe.reopener() is Probe and wrapper.reopener() is None
    elif name == "wake_up":
        await wrapper.wake_up(["weights"])
        assert probe.calls == [("wake_up", ["weights"])]
    elif name == "share_weights":  # the probe's own function: wrapped replicas still share one export
        assert wrapper.share_weights is Probe.share_weights and wrapper.share_weights(model) == ("exported", model)
    else:  # a value: accepts_images, dead, name, syncs_weights, supports_sleep, weight_version
        assert getattr(wrapper, name) == getattr(probe, name) != getattr(Plain(), name, None)


def test_the_wrapper_defines_every_declared_member_itself():
    assert {"generate", "close", "shares_model", "syncs_weights", "sleep", "update_weights"} <= MEMBERS
    assert {"name", "dead", "share_weights"} <= MEMBERS  # what a router asks of its replicas
    assert sorted(MEMBERS - set(vars(BackendWrapper))) == []  # declare it on Backend: forward it here


@pytest.mark.parametrize(
    "wrap", [BackendWrapper, VersionedBackend, RecordingBackend], ids=lambda w: f"{w.__module__}.{w.__name__}"
)
@pytest.mark.parametrize("name", sorted(MEMBERS))
async def test_every_declared_member_reaches_the_wrapped_backend(wrap, name):
    probe = Probe()
    await check_member(name, wrap(probe), probe)


async def test_versioned_backend_forwards_what_it_used_to_drop():
    """It answered ``supports_sleep``/``syncs_weights`` False and had no sleep, wake_up or
    update_weights, whatever it wrapped; its weight sync is a new version, applied between requests."""
    probe = Probe()
    versions = VersionedBackend(probe, version=3)
    assert versions.supports_sleep and versions.syncs_weights and isinstance(versions, WeightSync)
    await versions.sleep()
    await versions.wake_up(["kv_cache"])
    await versions.update_weights("model")
    assert probe.calls == [("sleep",), ("wake_up", ["kv_cache"]), ("update_weights", "model")]
    assert versions.version == 4 and versions.weight_version == 8
    assert (await versions.generate([1], PARAMS)).version == 4


async def test_a_wrapper_without_weight_sync_says_so():
    wrapper = BackendWrapper(Plain())
    assert not wrapper.syncs_weights and not isinstance(wrapper, WeightSync)
    assert not wrapper.supports_sleep and not wrapper.accepts_images
    with pytest.raises(BackendError, match="Plain has no weight sync"):
        await wrapper.update_weights(object())
    with pytest.raises(BackendError, match="Plain has no sleep mode"):
        await wrapper.sleep()


def test_a_wrapper_closes_nothing_it_did_not_open():
    probe = Probe()

    async def use():
        async with VersionedBackend(probe) as versions:
            await versions.generate([1], PARAMS)

    asyncio.run(use())
    assert ("close",) not in probe.calls


def test_wrapping_something_that_is_not_a_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="VersionedBackend wraps a rollforge Backend, got str"):
        VersionedBackend("http://127.0.0.1:8000")
