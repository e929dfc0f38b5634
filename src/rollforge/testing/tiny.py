"""A tiny, offline, seeded chat model for unit tests and quick benchmarks.

``make_tiny_model(directory)`` writes a directory that ``transformers`` loads like any checkpoint:
a byte-level BPE tokenizer trained in-process on a short built-in English corpus (``CORPUS``, so
ASCII text round-trips exactly through encode/decode), the ChatML special tokens and chat template
of SmolLM2-Instruct (same behaviour: a default system prompt is injected when the conversation does
not open with one; no tool support), and a randomly initialised two-layer ``LlamaForCausalLM`` with
tied embeddings. Nothing is downloaded and building takes well under a second or two; the same seed
gives the same weights.

``make_tokenizer()`` is that tokenizer alone (what a benchmark that only renders and parses needs,
and the base other test tokenizers train on with ``CORPUS``); ``tokenizer_or_tiny(directory)`` is
the tokenizer saved in ``directory``, or this one when none is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
#: Ids 0, 1, 2 as in SmolLM2.
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

#: ChatML as SmolLM2-Instruct renders it: one ``<|im_start|>role\ncontent<|im_end|>\n`` block per
#: message, a default system message first when the caller gives none, and an open assistant header
#: when ``add_generation_prompt`` is set.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

#: The English text the tiny tokenizer's merges are trained on.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model can still learn to count.
What is the capital of France? The capital of France is Paris.
Please answer the question and explain your reasoning step by step.
You are a helpful assistant. The user asks a question and the assistant answers it.
Two plus two is four. Three times five is fifteen. Ten minus seven is three.
The answer is 42. The result of 12 + 30 is 42, and 6 * 7 = 42 as well.
Call the tool with a JSON object: {"name": "move", "arguments": {"direction": "left"}}
The environment returns an observation, a reward and whether the episode is done.
In the morning the weather was cold, but by the afternoon the sun had come out.
She read the book in one evening and wrote a short letter to her friend.
Programs are written in Python: def add(a, b): return a + b
for i in range(10): print(i * i)
The agent moved up, then right, then down, and finally reached the goal.
Guess a number between 1 and 100. Too high! Too low! Correct, you win.
Good reasoning is careful, honest and clear. Check each step before the final answer.
Hello, world! How are you today? I am fine, thank you very much.
The train leaves the station at nine o'clock and arrives in the city at noon.
Water boils at one hundred degrees and freezes at zero degrees.
"""


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny chat model (tokenizer + random Llama weights) to ``directory``; return it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    model = _make_model(tokenizer, seed)
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


def make_tokenizer() -> Any:
    """The tiny model's tokenizer, built in memory: 640 byte-level BPE ids trained on ``CORPUS``,
    the ChatML special tokens at ids 0-2 and ``CHATML_TEMPLATE``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=640,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS.splitlines(keepends=True) * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=IM_START,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tokenizer_or_tiny(directory: str | Path | None) -> Any:
    """The tokenizer saved in ``directory``; the tiny model's (``make_tokenizer``) when it is None."""
    if directory is None:
        return make_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def _make_model(tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        # Larger than the usual 0.02 so that the random model has peaked next-token distributions:
        # greedy ties become vanishingly rare and sampled text is not uniform noise.
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()
