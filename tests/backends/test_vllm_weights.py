"""Weight export for engines in other processes (``backends/weights.py``), on the tiny offline model:
names, tied weights written once, a peft model merged on a copy; and the sync path's clear errors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rollforge.backends.weights import WEIGHTS_FILE, export_weights, is_peft_model, state_dict_for_export
from rollforge.errors import ConfigError
from rollforge.models import load_model


@pytest.fixture
def model(tiny_model_dir):
    return load_model(tiny_model_dir)[0]


def test_export_writes_every_weight_once_by_hugging_face_name(model, tmp_path):
    export_weights(model, tmp_path / "v1")
    written = load_file(str(tmp_path / "v1" / WEIGHTS_FILE))
    expected = {name for name, _ in model.named_parameters()}  # named_parameters lists a tied weight once
    assert set(written) == expected
    for name, parameter in model.named_parameters():
        assert torch.equal(written[name], parameter.detach())
    assert not (tmp_path / "v1" / (WEIGHTS_FILE + ".tmp")).exists()


def test_tied_output_head_is_written_once(model):
    model.lm_head.weight = model.model.embed_tokens.weight  # tie, as SmolLM2 does
    exported = state_dict_for_export(model)
    assert "model.embed_tokens.weight" in exported and "lm_head.weight" not in exported


def test_peft_model_is_merged_on_a_copy(model):
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    assert is_peft_model(lora)
    exported = state_dict_for_export(lora)
    layer = lora.base_model.model.model.layers[0].self_attn.q_proj
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * layer.scaling["default"]
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.allclose(exported[name], layer.base_layer.weight.detach() + delta.detach(), atol=1e-6)
    assert not any("lora_" in key for key in exported)
    assert isinstance(lora, peft.PeftModel) and hasattr(layer, "lora_A")  # the trainer's model keeps its adapter


def test_export_rejects_what_is_not_a_torch_module():
    with pytest.raises(ConfigError, match=r"update_weights needs a torch.nn.Module .*got dict"):
        state_dict_for_export({"weight": 1})
