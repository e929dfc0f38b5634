"""Per-environment reward functions for examples/multi_env.yaml.

Each returns one value per sample: a float where it applies and None elsewhere, so that a
multi-environment batch mixes them without one environment's shaping leaking into another's
(their per-function means are computed over the samples they applied to)."""


def short_arithmetic_answer(prompts, completions, environments=None, task_name=None, **columns):
    """arithmetic only: 1.0 for a reply of at most 5 characters (just the number)."""
    return [
        (1.0 if len(c[0]["content"].replace("<|im_end|>", "").strip()) <= 5 else 0.0) if task == "arithmetic" and c else None
        for c, task in zip(completions, task_name)
    ]


def code_block_used(prompts, completions, environments=None, task_name=None, **columns):
    """python_code only: 1.0 when the first reply calls a tool (writes code instead of prose)."""
    return [
        (1.0 if c and "<tool_call>" in c[0]["content"] else 0.0) if task == "python_code" else None
        for c, task in zip(completions, task_name)
    ]
