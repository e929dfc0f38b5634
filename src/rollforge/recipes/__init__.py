"""The recipes: what a user runs, each read top to bottom, built from the library in ``train/``
and the run's inputs in ``inputs/`` (torchtune keeps its recipes apart from its library the same
way).

- ``grpo``: the synchronous GRPO loop (``train_step``, ``train_sync``);
- ``grpo_async``: asynchronous GRPO with bounded staleness (``train_async``);
- ``launch``: ``train``/``atrain``: a run here, under torchrun, or its ranks on Ray (handing
  ``cluster/`` the entry point, never imported back), picking one of the two loops;
- ``sft`` (+ ``sft_config``, ``sft_data``, ``sft_step``: one step of its loss): supervised fine-tuning and rejection sampling;
- ``quickstart`` (+ ``presets/``): the SFT warm-up, then GRPO, then the report.

``rollforge.train.train``, ``atrain`` and ``TrainResult`` name ``launch``'s.
"""
