"""The helpers that read what a child process on the cluster printed."""

from __future__ import annotations

import json

import pytest
from multinode import RESULT, result_of


def test_the_marked_line_is_read_whatever_ray_prints_around_it():
    nodes = {"a1": "127.0.0.1"}
    warning = "\t(2) raylet has lagging heartbeats due to slow network or busy workload."
    stdout = f"2026 INFO connecting\n{RESULT}{json.dumps(nodes)}\n{warning}\n"
    assert result_of(stdout) == nodes


def test_no_marked_line_names_what_was_printed():
    with pytest.raises(AssertionError, match="lagging heartbeats"):
        result_of("raylet has lagging heartbeats\n")
