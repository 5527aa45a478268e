"""A checkpoint transformers saved reads back into the model tunesmith built: MoE experts that save_pretrained
splits one per expert are fused again as the model holds them (resume of Qwen3-MoE, DeepSeek-V3, GLM-4.5 MoE)."""

import pytest
import torch
import transformers
from safetensors.torch import save_file

from tunesmith.errors import TunesmithError
from tunesmith.models.tiny import build_tiny
from tunesmith.models.weights import load_model_weights, weights_by_model_key, with_fused_experts


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss", "qwen3"])
def test_saved_weights_read_back_into_a_fresh_model(tmp_path, arch):
    saved = transformers.AutoModelForCausalLM.from_pretrained(build_tiny(arch))
    with torch.no_grad():
        for param in saved.parameters():
            param.add_(torch.randn_like(param))  # not the initialisation the fresh model starts from
    saved.save_pretrained(tmp_path)
    fresh = transformers.AutoModelForCausalLM.from_pretrained(build_tiny(arch))
    load_model_weights(fresh, tmp_path)
    want = saved.state_dict()
    for name, tensor in fresh.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0, msg=name)
    by_key = weights_by_model_key(fresh, fresh.state_dict().keys(), tmp_path)
    assert set(by_key) == set(want)


def test_a_layer_with_an_expert_missing_is_left_unfused_and_named(tmp_path):
    keys = {"m.experts.gate_up_proj", "m.experts.down_proj"}
    state = {f"m.experts.{i}.{part}.weight": torch.zeros(2, 2) for i in (0, 1) for part in ("gate_proj", "up_proj")}
    state["m.experts.0.down_proj.weight"] = torch.zeros(2, 2)  # expert 1's down_proj is missing
    assert set(with_fused_experts(state, keys)) == set(state)
    save_file(state, str(tmp_path / "model.safetensors"))
    model = torch.nn.Module()
    model.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(TunesmithError, match="does not match the model: missing"):
        load_model_weights(model, tmp_path)
