"""The benchmarks: each module or package here is one ``rollforge bench NAME`` (registered in
``cli/bench.py``'s ``BENCHMARKS``) and nothing else. A benchmark with helpers is a package that
holds them (``vs_trl/``: the TRL comparison's runners, workloads and settings; ``learning/``: its
side processes; ``gpu/``: its sections and model configs); what several share is public where it
lives (``vs_trl.side_summary``, ``vs_trl.settings.Settings``) or in ``rollforge.testing``.
"""
