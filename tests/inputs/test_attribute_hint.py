"""A ``file.py:Name`` or ``module:name`` that names nothing gets the nearest name the module has."""

import pytest

from rollforge.errors import ConfigError
from rollforge.inputs.environments import import_attribute


def test_a_misspelled_attribute_gets_the_nearest_name(tmp_path, monkeypatch):
    (tmp_path / "counter_env.py").write_text("class Counter:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        import_attribute("counter_env.py:Countr")
    assert str(error.value) == (
        "module 'counter_env.py' has no attribute 'Countr' (from 'counter_env.py:Countr'); did you mean 'Counter'?"
    )
    with pytest.raises(ConfigError, match=r"has no attribute 'zzz' \(from 'counter_env.py:zzz'\)$"):
        import_attribute("counter_env.py:zzz")
