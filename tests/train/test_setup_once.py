"""Set-up once: a training run loads its tokenizer one time (the checks before the model loads and
the policy share it), counted on transformers' own loader."""

from __future__ import annotations

import transformers

from rollforge.recipes.launch import train


def test_a_training_run_loads_its_tokenizer_once(tiny_config, monkeypatch):
    config = tiny_config("steps=1", "eval_episodes=0")
    loads = []
    original = transformers.AutoTokenizer.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        loads.append(args[0] if args else kwargs)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(counting))
    train(config, console=False)
    assert len(loads) == 1, loads
