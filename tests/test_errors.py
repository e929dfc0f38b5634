"""The exception tree (rollforge.errors) and the boundary classification (rollforge.boundary)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import rollforge
from rollforge import errors
from rollforge.boundary import boundary, call_user, is_own_bug
from rollforge.errors import EpisodeFailed, InvariantError
from rollforge.rollout.metrics import rollout_metrics
from rollforge.types import Failure, Message


def raised(function, *args, **kwargs) -> BaseException:
    try:
        function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("expected an exception")


def users_typo():
    return len(5)


def users_bad_message():
    return Message("user", 42)


def test_every_exception_class_of_the_package_is_defined_in_errors():
    import importlib
    import pkgutil

    defined_elsewhere = []
    for module in pkgutil.walk_packages(rollforge.__path__, "rollforge."):
        if module.name.endswith("_launcher"):  # standalone inside the sandbox jail (see errors.py)
            continue
        try:
            loaded = importlib.import_module(module.name)
        except ImportError:  # optional dependencies (vllm, ray, ...) not installed here
            continue
        for name, value in vars(loaded).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.name:
                if module.name != "rollforge.errors":
                    defined_elsewhere.append(f"{module.name}.{name}")
    assert defined_elsewhere == []


def test_the_docstring_draws_every_class_of_the_tree():
    classes = [
        v
        for v in vars(errors).values()
        if inspect.isclass(v) and issubclass(v, BaseException) and v.__module__ == "rollforge.errors"
    ]
    assert len(classes) >= 15
    for cls in classes:
        assert cls.__name__ in errors.__doc__, cls.__name__


def test_a_type_error_raised_in_rollforges_code_is_a_bug_one_in_the_users_is_not():
    assert is_own_bug(raised(rollout_metrics, None, 0.0))  # raised by a frame of rollforge
    assert not is_own_bug(raised(users_typo))  # raised by the user's frame
    assert not is_own_bug(raised(call_user, users_typo, 1))  # the user's signature refused the arguments
    assert not is_own_bug(raised(call_user, len, 5))  # a builtin the user handed over
    assert is_own_bug(InvariantError("a broken trajectory"))
    assert is_own_bug(raised(Message, "user", 42))  # rollforge built an invalid message: its bug
    assert not is_own_bug(raised(users_bad_message))  # the user's code built it: the user's failure
    assert not is_own_bug(ValueError("bad value"))


def test_boundary_files_what_crosses_it_under_its_kind():
    with pytest.raises(EpisodeFailed) as info:
        with boundary("environment", "environment step"):
            raise ValueError("the simulator crashed")
    assert info.value.failure.kind == "env_error"
    assert info.value.failure.message == "environment step raised ValueError: the simulator crashed"
    for kind, failure_kind in [("backend", "backend_error"), ("tool", "tool_raised"), ("reward", "reward_error")]:
        with pytest.raises(EpisodeFailed) as info:
            with boundary(kind, None):
                users_typo()
        assert info.value.failure.kind == failure_kind
        assert info.value.failure.message == "TypeError: object of type 'int' has no len()"


def test_boundary_lets_bugs_cancellation_and_classified_failures_through():
    with pytest.raises(TypeError):
        with boundary("environment", "environment step"):
            rollout_metrics(None, 0.0)
    with pytest.raises(asyncio.CancelledError):
        with boundary("backend", None):
            raise asyncio.CancelledError()
    inner = raised(_failed)
    with pytest.raises(EpisodeFailed) as info:
        with boundary("backend", None):
            raise inner
    assert info.value is inner


def _failed():
    from rollforge.types import Failure

    raise EpisodeFailed(Failure("env_timeout", "too slow"))


def test_episode_failed_survives_pickling_with_its_failure():
    """An engine worker process sends an ``EpisodeFailed`` to its parent pickled: the failure's kind
    must arrive, not a bare message re-read as a ``backend_error``."""
    import pickle

    back = pickle.loads(pickle.dumps(EpisodeFailed(Failure("context_exceeded", "the prompt has 1088 tokens"))))
    assert isinstance(back, EpisodeFailed)
    assert (back.failure.kind, back.failure.message) == ("context_exceeded", "the prompt has 1088 tokens")
    assert str(back) == "context_exceeded: the prompt has 1088 tokens"
