"""Gateway fixtures: the tiny model's tokenizer and a scripted backend that calls a tool once."""

from __future__ import annotations

import pytest

from rollforge.backends.scripted import ScriptedBackend
from rollforge.chat.render import ChatRenderer
from rollforge.chat.toolcalls import get_parser

from gateway_helpers import reply_for


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def renderer(tokenizer):
    return ChatRenderer(tokenizer)


@pytest.fixture
def parser():
    return get_parser("hermes")


@pytest.fixture
def backend(tokenizer, renderer):
    return ScriptedBackend(lambda request: reply_for(renderer.decode(request.prompt_ids)), tokenizer)
