"""rope_scaling: LLaMA-Factory's RoPE scaling, applied to the config before the model is built."""

import json

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, Qwen2VLConfig, Qwen3Config

from conftest import run_config
from tunesmith.errors import ConfigError, ModelError
from tunesmith.models.rope import scale_rope


def _qwen3(**extra):
    return Qwen3Config(max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       **extra)


@pytest.mark.parametrize("kind, extra", [
    ("linear", {}),
    ("dynamic", {"original_max_position_embeddings": 4096}),
    ("yarn", {"original_max_position_embeddings": 4096}),
    ("llama3", {"original_max_position_embeddings": 4096, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
])
def test_the_factor_is_the_length_over_the_positions_rounded_up(kind, extra):
    config = _qwen3()
    scale_rope(config, kind, 10_000)  # 10,000 / 4,096 -> 3
    assert config.rope_parameters == {"rope_type": kind, "rope_theta": 1e6, "factor": 3.0, **extra}
    assert config.max_position_embeddings == 3 * 4096


def test_a_length_within_the_positions_leaves_the_config(caplog):
    config = _qwen3()
    with caplog.at_level("WARNING", logger="tunesmith"):
        scale_rope(config, "linear", 4096)
    assert config.rope_parameters["rope_type"] == "default" and config.max_position_embeddings == 4096
    assert "RoPE is not scaled" in caplog.text


def test_a_model_that_already_scales_is_kept_or_refused():
    llama = LlamaConfig(max_position_embeddings=131072, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    scale_rope(llama, "linear", 16384)  # within its 131,072 positions: left as it is
    assert llama.rope_parameters["rope_type"] == "llama3" and llama.rope_parameters["factor"] == 8.0
    with pytest.raises(ModelError, match="already scales RoPE .llama3, factor 8.0, 131072 positions"):
        scale_rope(llama, "linear", 200_000)


def test_a_vision_language_model_scales_its_text_config_and_keeps_mrope():
    config = Qwen2VLConfig(text_config={"max_position_embeddings": 1024, "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}})
    scale_rope(config, "linear", 2048)
    assert config.text_config.rope_parameters == {"rope_type": "linear", "rope_theta": 1e6,
                                                  "mrope_section": [2, 3, 3], "factor": 2.0}
    assert config.text_config.max_position_embeddings == 2048


def test_rope_per_layer_type_is_refused():
    with pytest.raises(ModelError, match="sets RoPE per layer type"):
        scale_rope(Gemma3TextConfig(max_position_embeddings=1024), "linear", 4096)


def test_a_full_run_saves_the_scaling_and_a_lora_adapter_is_loaded_with_it(tmp_path):
    from tunesmith.infer.load import load_for_inference, refuse_unservable_adapters
    from tunesmith.train.setup import train

    plain = train(run_config(tmp_path / "plain", max_steps=1))
    full = train(run_config(tmp_path / "full", max_steps=1, cutoff_len=8192, rope_scaling="linear"))
    saved = json.loads((tmp_path / "full" / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == "linear" and saved["rope_parameters"]["factor"] == 2.0
    assert saved["max_position_embeddings"] == 8192
    assert full.step_losses != plain.step_losses  # halved frequencies: another model

    train(run_config(tmp_path / "lora", max_steps=1, cutoff_len=8192, rope_scaling="linear", finetuning_type="lora",
                     save_strategy="steps", save_steps=1))
    model, _ = load_for_inference(str(tmp_path / "lora"), device=torch.device("cpu"))
    rotary = model.base_model.model.model.rotary_emb
    assert rotary.rope_type == "linear" and model.config.max_position_embeddings == 8192
    with pytest.raises(ModelError, match="trained with rope_scaling.*merge it first"):
        refuse_unservable_adapters([str(tmp_path / "lora")])
    checkpoint, _ = load_for_inference(str(tmp_path / "lora" / "checkpoint-1"), device=torch.device("cpu"))
    assert checkpoint.config.max_position_embeddings == 8192  # a checkpoint records the run's config too
    train(run_config(tmp_path / "within", max_steps=1, cutoff_len=4096, rope_scaling="linear", finetuning_type="lora"))
    refuse_unservable_adapters([str(tmp_path / "within")])  # within the base's positions: nothing was scaled
    with pytest.raises(ConfigError, match="was trained with rope_scaling: linear .rope_max_length 8192.; continuing"):
        run_config(tmp_path / "more", finetuning_type="lora", adapter_name_or_path=str(tmp_path / "lora"))
