"""Public constructors answer the natural first mistakes in one ``ConfigError`` line that says what
was expected (``arguments.py``), instead of a traceback from deep inside."""

from __future__ import annotations

import pytest

import rollforge
from rollforge import ChatRenderer, ConfigError, HFBackend, OpenAICompatSettings, VLLMBackend
from rollforge.backends.scripted import ScriptedBackend


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return rollforge.load_model(tiny_model_dir)


def _one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 300, message
    return message


def test_hf_backend_given_the_pair_load_model_returns_says_how_to_unpack_it(loaded):
    model, tokenizer = loaded
    for args in [(loaded, tokenizer), (model, loaded)]:
        message = _one_line_error(HFBackend, *args)
        assert message.startswith("HFBackend: ") and "load_model returns (model, tokenizer)" in message


def test_hf_backend_given_a_name_or_swapped_arguments_names_what_it_expected(loaded):
    model, tokenizer = loaded
    assert _one_line_error(HFBackend, "smollm2-135m", tokenizer) == (
        "HFBackend: model must be a loaded transformers model, got str 'smollm2-135m'; "
        "load it with rollforge.load_model(name)"
    )
    assert f"model must be a loaded transformers model, got {type(tokenizer).__name__}" in _one_line_error(
        HFBackend, tokenizer, model
    )


def test_chat_renderer_given_the_pair_or_a_name(loaded):
    assert "load_model returns (model, tokenizer)" in _one_line_error(ChatRenderer, loaded)
    message = _one_line_error(ChatRenderer, "smollm2-135m")
    assert message.startswith("ChatRenderer: tokenizer must be a Hugging Face tokenizer") and "got str" in message


def test_scripted_backend_checks_its_script_and_tokenizer(loaded):
    model, tokenizer = loaded
    assert "script must be a function of a ScriptedRequest, got str 'ok'" in _one_line_error(
        ScriptedBackend, "ok", tokenizer
    )
    assert "load_model returns (model, tokenizer)" in _one_line_error(ScriptedBackend, lambda r: "ok", loaded)


def test_backends_that_load_the_model_themselves_want_a_name(loaded):
    model, _ = loaded
    assert "VLLMBackend: model is a tuple; expected a model name" in _one_line_error(VLLMBackend, loaded)
    assert "VLLMBackend: model must be a model name, hub id or directory, got LlamaForCausalLM" in _one_line_error(
        VLLMBackend, model
    )
    assert "OpenAICompatBackend: model must be a model name" in _one_line_error(OpenAICompatSettings, model=model)
