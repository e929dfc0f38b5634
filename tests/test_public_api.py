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
        name for name, value in vars(rollforge).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name not in ("annotations", "Any")
    }
    assert public <= set(rollforge.__all__), public - set(rollforge.__all__)


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
