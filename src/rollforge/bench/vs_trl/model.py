"""The model of ``rollforge bench vs-trl``: a tiny Qwen2 that calls ``GuessNumber``'s tools.

``prepare_model()`` builds, offline and in a few minutes on 2 cores, a 0.9M-parameter
Qwen2-architecture model for the task in ``vs_trl.env``:

- a byte-level BPE tokenizer trained in-process on rendered episodes (ChatML special tokens at ids
  0, 1, 2 as in ``rollforge.testing``, ``<tool_call>``-style markers as ordinary added tokens as in
  Qwen2.5) with TRL's Qwen2.5 chat template;
- random weights warmed up by a few hundred supervised steps on scripted episodes (loss on the
  assistant tokens only) so that the model writes well-formed ``<tool_call>`` blocks, plays a few
  turns and stops, with enough randomness left for GRPO to have reward variance to learn from.

The result is cached under ``<rollforge cache>/bench/`` keyed by a hash of everything that
determines it, so only the first run pays for the warm-up.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from ...errors import InvariantError, ModelError
from .env import QWEN25_TEMPLATE, USER_PROMPT, render, scripted_episode

#: Bump when anything below changes the built model in a way the hash cannot see.
BUILD_VERSION = 3

MODEL_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
VOCAB_SIZE = 1024
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def build_tokenizer(texts: list[str]) -> Any:
    """Byte-level BPE trained on ``texts``; ChatML specials at ids 0-2; tool markers as added tokens.

    It is a ``Qwen2Tokenizer`` (Qwen2's pre-tokenizer: digits split one by one), because that is
    what ``AutoTokenizer`` makes of a saved Qwen2 checkpoint: the warm-up must tokenize exactly as
    both trainers will after loading the directory."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from ...testing import CORPUS

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKER_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*texts, *CORPUS.splitlines(keepends=True)], trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(m) for m in trained["merges"]],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        padding_side="left",
    )
    tokenizer.add_tokens([AddedToken(token, special=True) for token in SPECIAL_TOKENS])
    tokenizer.add_tokens(list(MARKER_TOKENS))  # not special: decoding keeps them, like Qwen2.5's
    tokenizer.chat_template = QWEN25_TEMPLATE
    return tokenizer


def build_model(tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **MODEL_CONFIG,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def assistant_labels(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of a conversation: labels are the ids on the tokens the assistant writes (from
    after its ``<|im_start|>assistant\\n`` header through ``<|im_end|>``) and -100 elsewhere."""
    text = render(messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start = len(render(messages[:i], add_generation_prompt=True))
            end = len(render(messages[: i + 1])) - 1  # the template's "\n" after <|im_end|> is not generated
            spans.append((start, end))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        token if any(start <= offset[0] < end for start, end in spans) else -100
        for token, offset in zip(encoded["input_ids"], encoded["offset_mapping"])
    ]
    return encoded["input_ids"], labels


def warm_up(model: Any, tokenizer: Any, steps: int, seed: int, batch_size: int = 16, lr: float = 5e-3) -> list[float]:
    """Supervised steps on scripted episodes (``shared_prefix_loss``); the loss of every step."""
    import torch

    rng = random.Random(seed)
    prefix = tokenizer(render([{"role": "user", "content": USER_PROMPT}]), add_special_tokens=False)["input_ids"]
    pool = []
    for _ in range(512):
        ids, labels = assistant_labels(tokenizer, scripted_episode(rng))
        if ids[: len(prefix)] != prefix:
            raise InvariantError("the scripted episodes do not share the rendered prompt as a token prefix")
        pool.append((ids[len(prefix) :], labels[len(prefix) :]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10) * (1 - s / steps))
    model.train()
    losses = []
    for _ in range(steps):
        batch = [pool[rng.randrange(len(pool))] for _ in range(batch_size)]
        loss = shared_prefix_loss(model, prefix, batch, tokenizer.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(round(loss.item(), 4))
    model.eval()
    return losses


def shared_prefix_loss(model: Any, prefix: list[int], batch: list[tuple[list[int], list[int]]], pad_id: int) -> Any:
    """Mean next-token loss over the labelled tokens of ``prefix + ids`` for each ``(ids, labels)``.

    Every episode opens with the same system and user messages (P tokens, most of each episode), so
    the prefix is run once and its keys and values are broadcast to the batch: the value and the
    gradients are those of running each full sequence, at P + B x S tokens of compute instead of
    B x (P + S). Logits are computed only where there is a label (never on the first suffix token)."""
    import torch
    from transformers import DynamicCache

    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([x + [pad_id] * (width - len(x)) for x, _ in batch])  # (B, S)
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])  # (B, S)
    mask = torch.tensor([[1] * (len(prefix) + len(x)) + [0] * (width - len(x)) for x, _ in batch])  # (B, P+S)
    shared = model.model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values  # (1, P) keys/values
    cache = DynamicCache()
    for layer, kv in enumerate(shared.layers):
        cache.update(kv.keys.expand(len(batch), -1, -1, -1), kv.values.expand(len(batch), -1, -1, -1), layer)
    hidden = model.model(input_ids=ids, attention_mask=mask, past_key_values=cache).last_hidden_state  # (B, S, H)
    targets = labels[:, 1:]  # position j predicts token j + 1
    chosen = targets != -100
    logits = model.lm_head(hidden[:, :-1][chosen])  # (N, V)
    return torch.nn.functional.cross_entropy(logits, targets[chosen])


def prepare_model(root: str | Path | None = None, *, warmup_steps: int = 300, seed: int = 0) -> Path:
    """The warmed-up model directory, built on first use and cached by a hash of its recipe."""
    import os
    import shutil
    import tempfile

    import torch

    from ...models import cache_dir

    recipe = {
        "version": BUILD_VERSION,
        "model": MODEL_CONFIG,
        "vocab": VOCAB_SIZE,
        "steps": warmup_steps,
        "seed": seed,
        "template": hashlib.sha256(QWEN25_TEMPLATE.encode()).hexdigest(),
        "prompt": USER_PROMPT,
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(root) if root is not None else cache_dir() / "bench"
    target = root / f"vs-trl-{key}"
    if (target / "warmup.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    texts = [render(scripted_episode(rng)) for _ in range(200)]
    tokenizer = build_tokenizer(texts)
    model = build_model(tokenizer, seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        losses = warm_up(model, tokenizer, warmup_steps, seed)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        tokenizer.save_pretrained(staging)
        model.save_pretrained(staging)
        _check_reloaded_tokenizer(staging, tokenizer, texts[:8])
        (staging / "warmup.json").write_text(json.dumps({"recipe": recipe, "losses": losses}) + "\n")
        os.replace(staging, target)  # atomic: a concurrent builder's identical result may already be there
    except OSError:
        if not (target / "warmup.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _check_reloaded_tokenizer(directory: Path, tokenizer: Any, texts: list[str]) -> None:
    """The trainers load the tokenizer with ``AutoTokenizer``; it must tokenize as the warm-up did."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(directory)
    for text in texts:
        if loaded(text)["input_ids"] != tokenizer(text)["input_ids"]:
            raise ModelError(
                f"AutoTokenizer loads {directory} as {type(loaded).__name__}, which tokenizes differently from "
                f"the {type(tokenizer).__name__} the model was warmed up with"
            )
