"""finetuning_type: freeze picks layers as LLaMA-Factory does: the last N (or first N for -N), all of them when N
is more than the model has, and 0 is refused."""

import logging

import pytest
from transformers import AutoModelForCausalLM

from tunesmith.config.load import build_config
from tunesmith.errors import ConfigError
from tunesmith.models.adapters import apply_finetuning


def _trained_layers(tiny_qwen3, layers: int) -> set[int]:
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    cfg = build_config(None, {"dataset": "x", "finetuning_type": "freeze", "freeze_trainable_layers": layers}).finetune
    return {int(n.split(".layers.")[1].split(".")[0]) for n, p in apply_finetuning(model, cfg).named_parameters()
            if p.requires_grad and ".layers." in n}


def test_last_first_and_more_than_the_model_has(tiny_qwen3, caplog):
    n = AutoModelForCausalLM.from_pretrained(tiny_qwen3).config.num_hidden_layers
    assert _trained_layers(tiny_qwen3, 1) == {n - 1}
    assert _trained_layers(tiny_qwen3, -1) == {0}
    caplog.set_level(logging.WARNING, logger="tunesmith")
    assert _trained_layers(tiny_qwen3, n + 6) == set(range(n)) == _trained_layers(tiny_qwen3, -(n + 6))
    assert f"more than this model's {n} layers: all {n} are trained" in caplog.text


def test_zero_layers_is_refused(tiny_qwen3):
    with pytest.raises(ConfigError, match="freeze_trainable_layers: 0 trains no layer"):
        _trained_layers(tiny_qwen3, 0)


def test_use_llama_pro_trains_the_expanded_blocks_only(tiny_qwen3):
    from tunesmith.models.adapters import expanded_layers

    assert expanded_layers(24, 8) == [2, 5, 8, 11, 14, 17, 20, 23]  # 16 layers expanded by 8: one after every two
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    n = model.config.num_hidden_layers
    cfg = build_config(None, {"dataset": "x", "finetuning_type": "freeze", "use_llama_pro": True,
                              "freeze_trainable_layers": 1}).finetune
    trained = {n_.split(".layers.")[1].split(".")[0] for n_, p in apply_finetuning(model, cfg).named_parameters()
               if p.requires_grad}
    assert trained == {str(n - 1)}
    lora = build_config(None, {"dataset": "x", "finetuning_type": "lora", "use_llama_pro": True,
                               "freeze_trainable_layers": 1, "lora_target": "q_proj,v_proj"}).finetune
    adapted = {n_ for n_, p in apply_finetuning(AutoModelForCausalLM.from_pretrained(tiny_qwen3), lora)
               .named_parameters() if p.requires_grad}
    assert adapted and all(f".layers.{n - 1}." in a and ("q_proj" in a or "v_proj" in a) for a in adapted)


def test_use_llama_pro_refusals():
    with pytest.raises(ConfigError, match="use_llama_pro: true .* finetuning_type: full cannot"):
        build_config(None, {"dataset": "x", "finetuning_type": "full", "use_llama_pro": True})
    from tunesmith.models.adapters import expanded_layers

    with pytest.raises(ConfigError, match="28 layers must be a multiple of freeze_trainable_layers \\(8\\)"):
        expanded_layers(28, 8)
