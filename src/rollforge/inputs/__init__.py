"""What a run reads: its environments and its prompts, read once, and its evaluation.

A floor below ``train/`` and beside nothing that trains: training (``train/run_setup.py``), the recipes
(SFT's rejection sampling, the quickstart), ``rollforge rollout``, ``rollforge eval`` and the
benchmarks all read their inputs here, so ``rollforge rollout`` never enters ``train/``.

- ``config``: the ``environments`` and ``data`` sections (``EnvConfig``, ``DataConfig``), which
  ``TrainConfig`` and ``SFTConfig`` hold;
- ``read``: ``read_inputs``, the one door: environments by task and the samples, checked against
  each other before anything runs;
- ``environments``: a name or an object as an ``Environment`` (bundled, families, OpenEnv URLs,
  ``module:attribute``, ``file.py:attribute``);
- ``data``: prompt rows from files, rows to samples, the bundled generators, and ``PromptSource``
  (the seeded order a training run draws prompts in);
- ``evaluate``: mean reward and pass@k of a policy on prompts (``aevaluate``), and ``evaluate``:
  open a backend, evaluate, close it.
"""
