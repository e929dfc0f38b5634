"""The public API: every exported name exists, and importing rollforge does not import torch."""

import subprocess
import sys
import types

import rollforge


def test_all_names_resolve_and_nothing_public_is_missing():
    for name in rollforge.__all__:
        assert getattr(rollforge, name) is not None, name
    assert len(set(rollforge.__all__)) == len(rollforge.__all__)
    assert rollforge.__all__ == sorted(rollforge.__all__)
    public = {
        name
        for name, value in vars(rollforge).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name not in ("annotations", "Any")
    }
    assert public <= set(rollforge.__all__), public - set(rollforge.__all__)


#: Exception classes a user never meets, each with where it stays: they never leave rollforge.
INTERNAL_ERRORS = {
    "EpisodeFailed",  # the engine catches it and files its Failure on the trajectory
    "WireError",  # the gateway answers it as an HTTP error
    "OtherSideFailed",
    "SideFailed",  # a comparison benchmark's sides, reported by `rollforge bench`
}


def test_every_exception_a_user_meets_is_exported():
    from rollforge import errors

    tree = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.RollforgeError)
    }
    assert INTERNAL_ERRORS <= tree
    assert sorted(tree - INTERNAL_ERRORS - set(rollforge.__all__)) == []
    assert {"RewardUnavailable", "SandboxUnavailable", "ToolArgumentError"} <= set(rollforge.__all__)


def test_import_is_light():
    code = "import sys, rollforge; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_unknown_attribute_is_an_attribute_error():
    try:
        rollforge.NoSuchThing
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
