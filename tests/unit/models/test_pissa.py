"""PiSSA (pissa_init, pissa_iter, pissa_convert): models/pissa.py."""

import json

import pytest
import torch

from conftest import run_config
from tunesmith.errors import ConfigError, ModelError
from tunesmith.infer.load import load_for_inference, refuse_unservable_adapters
from tunesmith.train.setup import train

PISSA = dict(finetuning_type="lora", lora_rank=4, pissa_init=True, pissa_iter=4, learning_rate=3e-3)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_the_trained_adapter_loads_as_trained_and_its_conversion_is_an_ordinary_lora(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "o"
    result = train(run_config(out, max_steps=4, pissa_convert=True, **PISSA))
    assert result.step_losses[-1] < result.step_losses[0]
    assert json.loads((out / "adapter_config.json").read_text())["init_lora_weights"] == "pissa_niter_4"
    converted = json.loads((out / "pissa_converted" / "adapter_config.json").read_text())
    assert converted["init_lora_weights"] is True and converted["r"] == 8
    assert (out / "pissa_init" / "adapter_model.safetensors").is_file()

    ids = torch.randint(0, 100, (1, 16))
    ours, _ = load_for_inference(str(out), device=torch.device("cpu"))
    again, _ = load_for_inference(str(out), device=torch.device("cpu"))  # the same residual at every load
    base_path = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    torch.manual_seed(1)  # plain PEFT on the pretrained weights: no PiSSA initialisation, no seed involved
    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), str(out / "pissa_converted"))
    base = AutoModelForCausalLM.from_pretrained(base_path)
    assert torch.equal(_logits(ours, ids), _logits(again, ids))
    assert torch.allclose(_logits(ours, ids), _logits(plain, ids), atol=1e-4)
    assert not torch.allclose(_logits(ours, ids), _logits(base, ids), atol=1e-3)  # it trained

    with pytest.raises(ModelError, match="is a PiSSA adapter.*pissa_converted"):
        refuse_unservable_adapters([str(out)])
    refuse_unservable_adapters([str(out / "pissa_converted")])


def test_a_resumed_run_goes_on_from_the_same_residual(tmp_path):
    common = dict(lr_scheduler_type="constant", save_strategy="steps", save_steps=2, **PISSA)
    straight = train(run_config(tmp_path / "straight", max_steps=4, **common))
    train(run_config(tmp_path / "parted", max_steps=2, **common))
    resumed = train(run_config(tmp_path / "parted", max_steps=4, resume_from_checkpoint=True, **common))
    assert resumed.step_losses == pytest.approx(straight.step_losses[2:], rel=1e-5)


@pytest.mark.parametrize("overrides, refusal", [
    (dict(finetuning_type="oft"), "pissa_init initialises LoRA adapters: use finetuning_type: lora, not oft"),
    (dict(stage="dpo", dataset="dpo_demo"), "pissa_init with stage dpo's reference"),
    (dict(backend="fsdp2"), "pissa_init runs on one process"),
    (dict(quantization_bit=4), "pissa_init on a quantized model"),
])
def test_what_pissa_cannot_start_from_is_refused(tmp_path, overrides, refusal):
    with pytest.raises(ConfigError) as err:
        run_config(tmp_path / "o", **{**PISSA, **overrides})
    assert any(refusal in p for p in err.value.problems), err.value.problems


def test_a_simpo_run_needs_no_reference_and_takes_pissa(tmp_path):
    cfg = run_config(tmp_path / "o", stage="dpo", dataset="dpo_demo", pref_loss="simpo", **PISSA)
    assert cfg.finetune.pissa_init
