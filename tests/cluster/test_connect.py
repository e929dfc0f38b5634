"""Connecting to Ray: the private instance stays on loopback; local runs never import Ray; a
missing Ray names the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollforge.cluster import connect
from rollforge.errors import MissingDependency


def test_the_private_instance_is_bound_to_loopback(ray_session):
    nodes = [n for n in ray_session.nodes() if n["Alive"]]
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"]
    assert ray_session.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def test_local_runs_do_not_import_ray():
    code = (
        "import sys\n"
        "from rollforge.cli.main import main\n"
        "import rollforge.recipes.launch, rollforge.train.config, rollforge.rollout.engine\n"
        "from rollforge.train.config import load_config\n"
        "assert load_config().executor == 'local'\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_executor_ray_without_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the extra sees
    with pytest.raises(MissingDependency, match=r"rollforge\[ray\]"):
        connect.import_ray()
