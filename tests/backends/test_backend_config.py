"""BackendConfig: every bad value or combination is one line naming it and what was expected."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from rollforge.backends.config import BackendConfig, server_urls
from rollforge.errors import ConfigError


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kind": "sglang"}, "unknown backend 'sglang': expected one of hf, vllm, openai"),
        ({"model": ""}, "model must be a model directory, hub id or alias, got ''"),
        ({"concurrency": 0}, "concurrency must be an integer >= 1, got 0"),
        ({"concurrency": 2.5}, "concurrency must be an integer >= 1, got 2.5"),
        ({"replicas": 0}, "replicas must be an integer >= 1, got 0"),
        ({"replicas": True}, "replicas must be an integer >= 1, got True"),
        ({"seed": "1"}, "seed must be an integer, got '1'"),
        ({"request_timeout": 0}, "request_timeout must be a number of seconds > 0 or None, got 0"),
        ({"replica_cpus": -1}, "replica_cpus must be a number >= 0 or None, got -1"),
        ({"replica_gpus": None}, "replica_gpus must be a number >= 0, got None"),
        (
            {"options": ["enable_lora"]},
            "options must be a mapping of backend constructor arguments, got ['enable_lora']",
        ),
        (
            {"base_url": "http://127.0.0.1:8000"},
            "base_url is only used by the openai backend, not by 'hf' (got 'http://127.0.0.1:8000')",
        ),
        ({"kind": "openai"}, "the openai backend needs base_url (e.g. --base-url http://127.0.0.1:8000)"),
        (
            {"kind": "openai", "base_url": "http://a:1,,"},
            "base_url must name one or more servers, comma-separated, got 'http://a:1,,'",
        ),
        ({"kind": "openai", "base_url": []}, "base_url must name one or more servers, comma-separated, got []"),
        (
            {"kind": "openai", "base_url": "http://a:1,http://b:2", "replicas": 3},
            "the openai backend has one replica per URL: replicas=3 but base_url names 2 server(s) (http://a:1, http://b:2)",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_it(values, message):
    with pytest.raises(ConfigError) as caught:
        BackendConfig(**values)
    assert str(caught.value) == message and "\n" not in message


def test_the_value_is_frozen_typed_and_travels_pickled():
    options = {"enable_lora": True}
    config = BackendConfig(kind="openai", base_url=["http://a:1", " http://b:2 "], replicas=2, options=options)
    options["enable_lora"] = False  # the config holds its own copy
    assert config.options == {"enable_lora": True}
    assert config.base_url == ("http://a:1", "http://b:2") and config.urls == ["http://a:1", "http://b:2"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.kind = "hf"
    assert pickle.loads(pickle.dumps(config)) == config  # what a Ray replica receives
    assert BackendConfig().urls == [] and BackendConfig().replicas == 1
    one = dataclasses.replace(config, replicas=1)  # replace re-checks: still valid
    assert one.replicas == 1
    with pytest.raises(ConfigError, match="base_url is only used by the openai backend"):
        dataclasses.replace(config, kind="hf")
    assert server_urls("http://a:1, http://b:2") == ["http://a:1", "http://b:2"]


def test_equal_configs_hash_alike():
    a = BackendConfig(kind="vllm", model="m", options={"enable_lora": True})
    b = BackendConfig(kind="vllm", model="m", options={"enable_lora": True})
    assert a == b and hash(a) == hash(b) and a != BackendConfig(kind="vllm", model="m")
