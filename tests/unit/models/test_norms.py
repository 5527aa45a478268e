"""models/norms.py: PyTorch's fused RMSNorm gives transformers' RMSNorm (Llama's form) for the dtypes a run
meets, in the input's dtype (bf16 heads within bf16 rounding), and replaces only Liger norms of that form."""

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
    assert use_fused_rms_norms(model) == 1
    model["llama"](torch.randn(2, 1024))
    for kept in ("gemma", "head"):
        with pytest.raises(AssertionError, match="Liger"):
            model[kept](torch.randn(2, model[kept].weight.numel()))
