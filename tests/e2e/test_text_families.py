"""The text families end to end on the CPU, each rendered by its own chat template (template: auto).

For every family: full SFT learns (loss finite and falling over 6 steps at lr 3e-3; MoE families with a router
load-balancing loss log it as aux_loss), the saved folder loads in plain transformers and `tunesmith chat`
answers from it. For every family: a LoRA SFT run, a DPO step and a GRPO step. The default run covers one family of each group (dense: gemma3, with its sliding-window layers; MoE:
qwen3_moe); the others are marked slow.
"""

import json
import math

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import run_config
from tunesmith.cli import main
from tunesmith.models.families import text_family_of
from tunesmith.train.setup import train

DENSE = ["gemma3", "llama3", "mistral", "ministral", "phi4", "glm4", "qwen3_5"]
MOE = ["qwen3_moe", "gpt_oss", "deepseek_v3", "glm4_moe", "qwen4_exp"]
DEFAULT = {"gemma3", "qwen3_moe"}


def _params(archs):
    return [pytest.param(arch, marks=() if arch in DEFAULT else pytest.mark.slow) for arch in archs]


def _config(out, arch, **overrides):
    return run_config(out, model_name_or_path=f"tiny:{arch}", template="auto", **overrides)


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def varied_reward(prompts, responses, samples, **kw):
    """Differs inside every group, so the advantages (and the loss) are not all zero."""
    return [float(len(r) % 3) + 0.1 * i for i, r in enumerate(responses)]


@pytest.mark.parametrize("arch", _params(DENSE + MOE))
def test_full_sft_learns_saves_a_transformers_model_and_chat_answers(tmp_path, capsys, arch):
    out = tmp_path / arch
    result = train(_config(out, arch, max_steps=6, learning_rate=3e-3, max_samples=24, per_device_train_batch_size=4))
    losses = result.step_losses
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.3, losses

    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    family = text_family_of(model)
    aux = [row["aux_loss"] for row in _rows(out) if "aux_loss" in row]
    if family.balancing == "aux_loss":  # the router loss is in the loss and in the log
        assert len(aux) == 6 and all(math.isfinite(x) and x > 0 for x in aux)
    else:
        assert aux == []
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        assert torch.isfinite(model(**ids).logits).all()

    capsys.readouterr()
    assert main(["chat", "--model", str(out), "--prompt", "hi", "--max_new_tokens", "8"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("arch", _params(DENSE) + [pytest.param(a, marks=pytest.mark.slow) for a in MOE])
def test_lora_sft_and_a_dpo_step(tmp_path, arch):
    lora = tmp_path / "lora"
    result = train(_config(lora, arch, finetuning_type="lora", lora_rank=4, max_steps=2, learning_rate=1e-2,
                           max_samples=8))
    assert all(math.isfinite(x) for x in result.step_losses)
    adapter = json.loads((lora / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(adapter["base_model_name_or_path"])
    family = text_family_of(base)
    assert {name.split(".")[-1] for name in adapter["target_modules"]} == set(family.lora_targets)
    assert set(adapter.get("target_parameters") or ()) == set(family.lora_parameters)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = base(input_ids=ids).logits
        after = PeftModel.from_pretrained(base, lora)(input_ids=ids).logits  # the saved adapter loads and acts
    assert torch.isfinite(after).all() and not torch.allclose(before, after)

    dpo = train(_config(tmp_path / "dpo", arch, stage="dpo", dataset="dpo_demo", max_steps=1, max_samples=4,
                        per_device_train_batch_size=2))
    assert len(dpo.step_losses) == 1 and math.isfinite(dpo.step_losses[0])
    assert dpo.step_losses[0] == pytest.approx(math.log(2), abs=1e-3)  # the policy starts as its reference
    assert (tmp_path / "dpo" / "model.safetensors").exists()


@pytest.mark.parametrize("arch", _params(DENSE + MOE))
def test_one_grpo_step(tmp_path, arch):
    out = tmp_path / arch
    result = train(_config(out, arch, stage="grpo", dataset="arith_rl", max_samples=8, num_generations=4,
                           prompts_per_step=2, max_new_tokens=6, per_device_train_batch_size=8, max_steps=1,
                           reward_funcs=["test_text_families:varied_reward"]))
    assert result.global_step == 1 and all(math.isfinite(x) for x in result.step_losses)
    assert (out / "model.safetensors").exists()
