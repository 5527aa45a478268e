"""QLoRA (quantization_bit): LoRA adapters trained on a bitsandbytes-quantized model, on the CPU here."""

import json

import pytest
import torch

from conftest import run_config
from tunesmith.errors import ConfigError

bnb = pytest.importorskip("bitsandbytes")  # in the dev extras: CI installs it


@pytest.mark.parametrize("bits, layer", [(4, "Linear4bit"), (8, "Linear8bitLt")])
def test_the_linears_load_quantized_and_the_rest_as_it_was(tmp_path, bits, layer):
    from tunesmith.models.load import load_model

    cfg = run_config(tmp_path, finetuning_type="lora", quantization_bit=bits).model
    model = load_model(cfg, torch.device("cpu"))
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == layer
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.float32
    assert model.model.norm.weight.dtype == torch.float32


def test_a_qlora_run_learns_resumes_and_saves_an_adapter_for_the_plain_base(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tunesmith.models.tiny import resolve_model_path
    from tunesmith.train.setup import train

    out = tmp_path / "o"
    options = dict(finetuning_type="lora", quantization_bit=4, learning_rate=5e-3, save_strategy="steps",
                   save_steps=3)
    first = train(run_config(out, max_steps=3, **options))
    resumed = train(run_config(out, max_steps=6, **options))
    assert resumed.global_step == 6 and resumed.step_losses[-1] < first.step_losses[0]
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny:qwen3"))
    adapted = PeftModel.from_pretrained(base, str(out))  # the adapter applies to the unquantized base
    assert any("lora_B" in name and value.abs().sum() > 0 for name, value in adapted.named_parameters())


def test_qlora_needs_lora_one_process_and_trained_weights():
    from tunesmith.config.load import build_config

    with pytest.raises(ConfigError) as info:
        build_config(None, {"dataset": "x", "quantization_bit": 4, "finetuning_type": "full", "backend": "fsdp2",
                            "random_init": True, "torch_compile": True})
    text = "\n".join(info.value.problems)
    assert "use finetuning_type: lora (or oft), not full" in text and "not backend: fsdp2" in text
    assert "random_init builds fresh ones" in text and "torch_compile with quantization_bit" in text
    with pytest.raises(ConfigError, match="hqq.*only bitsandbytes|only bitsandbytes"):
        build_config(None, {"dataset": "x", "quantization_bit": 4, "quantization_method": "hqq"})


def test_the_estimate_counts_quantized_weights():
    from tunesmith.config.load import build_config
    from tunesmith.estimate import estimate_memory

    given = {"dataset": "x", "model_name_or_path": "tiny:qwen3", "finetuning_type": "lora"}
    plain = estimate_memory(build_config(None, given), num_gpus=1, gpu_gib=80)
    quantized = estimate_memory(build_config(None, {**given, "quantization_bit": 4}), num_gpus=1, gpu_gib=80)
    assert quantized["weights"] < plain["weights"]
