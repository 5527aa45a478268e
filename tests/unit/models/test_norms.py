"""models/norms.py: PyTorch's fused RMSNorm gives transformers' RMSNorm (Llama's form) for the dtypes a run
meets, in the input's dtype (bf16 heads within bf16 rounding); only Liger norms of that form are replaced, and off
CUDA they keep PyTorch's kernel (hidden size) or Liger's (heads)."""

import sys
import types

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from tunesmith.models.norms import fused_rms_norm, use_fused_rms_norms


@pytest.mark.parametrize("hidden_dtype,weight_dtype", [(torch.float32, torch.float32),  # residual stream, autocast
                                                       (torch.bfloat16, torch.float32),  # q/k heads, autocast
                                                       (torch.bfloat16, torch.bfloat16)])  # pure_bf16
def test_fused_forward_matches_transformers(hidden_dtype, weight_dtype):
    torch.manual_seed(0)
    norm = Qwen3RMSNorm(64, eps=1e-6).to(weight_dtype)
    with torch.no_grad():
        norm.weight.add_(torch.randn(64, dtype=weight_dtype) * 0.1)
    hidden = torch.randn(3, 5, 64).to(hidden_dtype)
    expected, got = norm(hidden), fused_rms_norm(norm, hidden)
    assert got.dtype == hidden_dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-6 if hidden_dtype == torch.float32 else 1.6e-2,
                               atol=1e-6)


def test_only_llama_form_liger_norms_are_replaced(monkeypatch):
    class LigerRMSNorm(torch.nn.Module):  # the attributes Liger's class has
        def __init__(self, offset, casting_mode, width=1024):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(width))
            self.variance_epsilon, self.offset, self.casting_mode = 1e-6, offset, casting_mode

        def forward(self, hidden):
            raise AssertionError("Liger's kernel ran")

    fake = types.ModuleType("liger_kernel.transformers.rms_norm")
    fake.LigerRMSNorm = LigerRMSNorm
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.rms_norm", fake)
    model = torch.nn.ModuleDict({"llama": LigerRMSNorm(0.0, "llama"), "gemma": LigerRMSNorm(1.0, "gemma"),
                                 "head": LigerRMSNorm(0.0, "llama", width=128)})
    assert use_fused_rms_norms(model) == 2
    model["llama"](torch.randn(2, 1024))
    for kept in ("gemma", "head"):  # the head's CPU fallback is Liger's forward
        with pytest.raises(AssertionError, match="Liger"):
            model[kept](torch.randn(2, model[kept].weight.numel()))


def test_pre_norms_of_dense_decoder_layers_are_found():
    """Only the pre-norms of the dense decoder layers (read by linears alone) may write the autocast dtype."""
    from transformers import Qwen3Config, Qwen3MoeConfig
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Model
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeModel

    from tunesmith.models.norms import _pre_norms

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, vocab_size=64)
    dense = Qwen3Model(Qwen3Config(**small))
    assert _pre_norms(dense) == {id(layer.input_layernorm) for layer in dense.layers} | {
        id(layer.post_attention_layernorm) for layer in dense.layers}
    assert _pre_norms(Qwen3MoeModel(Qwen3MoeConfig(**small, moe_intermediate_size=16, num_experts=4,
                                                   num_experts_per_tok=2))) == set()
