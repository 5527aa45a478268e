"""PiSSA (pissa_init, pissa_iter, pissa_convert): models/pissa.py."""

import json
import math

import pytest
import torch

from conftest import run_config
from tunesmith.config.resolve import resolve_reference
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
    for name in ("tokenizer_config.json", "chat_template.jinja", "tunesmith_config.yaml"):  # served as it is
        assert (out / "pissa_converted" / name).is_file(), name

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
    (dict(stage="dpo", dataset="dpo_demo", pref_reference="adapters_off"),
     "pissa_init with pref_reference: adapters_off"),
    (dict(backend="fsdp2"), "pissa_init runs on one process"),
    (dict(quantization_bit=4), "pissa_init on a quantized model"),
])
def test_what_pissa_cannot_start_from_is_refused(tmp_path, overrides, refusal):
    with pytest.raises(ConfigError) as err:
        run_config(tmp_path / "o", **{**PISSA, **overrides})
    assert any(refusal in p for p in err.value.problems), err.value.problems


def test_a_dpo_reference_is_a_copy_of_the_starting_model(tmp_path):
    """auto takes copy under PiSSA: at the first step policy and reference agree, so DPO's loss is log 2."""
    cfg = run_config(tmp_path / "o", stage="dpo", dataset="dpo_demo", max_steps=1, **PISSA)
    assert resolve_reference(cfg) == "copy"
    assert train(cfg).step_losses[0] == pytest.approx(math.log(2), abs=1e-4)


def test_the_fast_svd_draws_the_same_numbers_on_every_device_and_leaves_the_run_s_own():
    from tunesmith.models.pissa import seeded

    weight = torch.randn(32, 16)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = []
    for device in devices:
        torch.manual_seed(len(results))  # the run's random state differs: the draws do not
        state = torch.random.get_rng_state()
        with seeded():
            results.append(torch.svd_lowrank(weight.to(device), q=4, niter=2)[0].cpu())
        assert torch.equal(torch.random.get_rng_state(), state)
    with seeded():
        results.append(torch.svd_lowrank(weight, q=4, niter=2)[0])
    for other in results[1:]:
        assert torch.allclose(results[0].abs(), other.abs(), atol=1e-4)


def test_a_pissa_reward_model_scores_as_trained_and_a_new_run_clears_the_pissa_folders(tmp_path):
    from tunesmith.infer.reward import load_reward_model

    out = tmp_path / "rm"
    train(run_config(out, stage="rm", dataset="dpo_demo", max_steps=2, pissa_convert=True, **PISSA))
    base = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    ids = torch.randint(0, 100, (1, 12))
    named, _ = load_reward_model(str(out), torch.device("cpu"), base=base)
    recorded, _ = load_reward_model(str(out), torch.device("cpu"))
    assert torch.equal(_logits(named, ids), _logits(recorded, ids))

    train(run_config(out, max_steps=1, finetuning_type="lora", overwrite_output_dir=True))
    assert not (out / "pissa_init").exists() and not (out / "pissa_converted").exists()


def test_a_pissa_adapter_from_another_tool_is_loaded_with_a_warning(tmp_path, caplog):
    import shutil

    from tunesmith import quiet

    out = tmp_path / "o"
    train(run_config(out, max_steps=1, **PISSA))
    elsewhere = tmp_path / "lf"
    elsewhere.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(out / name, elsewhere / name)
    quiet._said.clear()
    with caplog.at_level("WARNING", logger="tunesmith"):
        load_for_inference(str(out), device=torch.device("cpu"))
        assert "another tool trained" not in caplog.text
        load_for_inference(str(elsewhere), device=torch.device("cpu"))
    assert "is a PiSSA adapter another tool trained" in caplog.text
