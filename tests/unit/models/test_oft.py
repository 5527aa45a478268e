"""finetuning_type: oft (LLaMA-Factory's OFT): PEFT's orthogonal adapters on lora_target."""

import json

import pytest
import torch

from conftest import run_config
from tunesmith.train.setup import train


def test_an_oft_run_learns_saves_an_adapter_and_exports_it_merged(tmp_path):
    from tunesmith.infer.load import load_for_inference, refuse_non_lora

    out = tmp_path / "o"
    result = train(run_config(out, finetuning_type="oft", oft_block_size=8, max_steps=6, learning_rate=1e-2))
    assert result.step_losses[-1] < result.step_losses[0]
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "OFT" and adapter["oft_block_size"] == 8
    merged, _ = load_for_inference(str(out), device=torch.device("cpu"), merge=True)
    adapted, _ = load_for_inference(str(out), device=torch.device("cpu"))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-4)
    with pytest.raises(Exception, match="OFT adapter, and vLLM serves LoRA adapters only"):
        refuse_non_lora([str(out)])


def test_oft_with_a_rank_alone_and_as_a_dpo_policy_with_its_adapters_off_as_reference(tmp_path):
    result = train(run_config(tmp_path / "dpo", stage="dpo", dataset="dpo_demo", finetuning_type="oft", oft_rank=4,
                              max_steps=2))
    assert result.step_losses[0] == pytest.approx(0.6931, abs=1e-3)  # the reference is the policy at step 1
    adapter = json.loads((tmp_path / "dpo" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["oft_block_size"]) == (4, 0)


def test_oft_keys_elsewhere_and_oft_on_megatron():
    from tunesmith.config.load import build_config
    from tunesmith.errors import ConfigError

    with pytest.raises(ConfigError, match="finetuning_type: oft is not available on backend: megatron"):
        build_config(None, {"dataset": "x", "finetuning_type": "oft", "backend": "megatron"})
    cfg = build_config(None, {"dataset": "x", "finetuning_type": "oft", "adapter_name_or_path": "some/adapter"})
    assert cfg.finetune.finetuning_type == "oft"
