"""GPU: FlashAttention 4 behind PyTorch's FlashAttention ops (models/flash_impl.py) gives the variable-length
attention (models/attention.flash_varlen) the outputs and gradients of PyTorch's built-in FlashAttention-2, within
bf16 noise. Needs a Hopper or Blackwell GPU, torch >= 2.10 and flash-attn-4 (benchmarks/fa4_bundle.sh carries it).

    python -m pytest -q -s tests/gpu/test_flash_impl_gpu.py      # on the device machine
"""

import pytest
import torch

from tunesmith.models import flash_impl
from tunesmith.models.attention import flash_varlen

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or flash_impl.fa4_unavailable(torch.device("cuda")) is not None,
    reason="needs a GPU where FlashAttention 4 runs (flash_impl.fa4_unavailable)")


def _attention_and_grads(q, k, v, cu, longest, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flash_varlen(q, k, v, cu, longest)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def test_fa4_matches_pytorchs_flash_attention_2():
    torch.manual_seed(0)
    cu = torch.tensor([0, 300, 1100, 2048, 2600, 4096], dtype=torch.int32, device="cuda")
    longest = int((cu[1:] - cu[:-1]).max())
    q = torch.randn(4096, 16, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4096, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    grad = torch.randn_like(q)
    fa2 = _attention_and_grads(q, k, v, cu, longest, grad)  # before activation: PyTorch's own kernels
    assert flash_impl.activate("fa4", q.device) == "FA4"
    fa4 = _attention_and_grads(q, k, v, cu, longest, grad)
    for name, ours, theirs in zip(("out", "dq", "dk", "dv"), fa4, fa2):
        scale = float(theirs.float().abs().max())
        error = float((ours.float() - theirs.float()).abs().max())
        assert error <= 0.02 * scale, f"{name}: FA4 differs from FA2 by {error:.3g} (largest value {scale:.3g})"
