"""``bench/`` holds registered benchmarks only: every module or package directly under
``rollforge.bench`` is one ``rollforge bench NAME`` (helpers live inside their benchmark's package)."""

import pkgutil

import rollforge.bench
from rollforge.cli.bench import BENCHMARKS


def test_bench_holds_the_registered_benchmarks_and_nothing_else():
    present = {m.name for m in pkgutil.iter_modules(rollforge.bench.__path__)}
    assert present == {module for module, _ in BENCHMARKS.values()}
    assert {"vs_trl", "learning", "gpu"} <= {m.name for m in pkgutil.iter_modules(rollforge.bench.__path__) if m.ispkg}
