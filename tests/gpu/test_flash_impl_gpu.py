"""GPU: with FlashAttention 4 switched on (models/flash_impl.py) the variable-length attention
(models/attention.flash_varlen) gives the outputs and gradients of PyTorch's built-in FlashAttention-2 within bf16
noise, causal (packed rows) and not (a vision tower's images). Needs a Hopper or Blackwell GPU and flash-attn-4
(benchmarks/fa4_bundle.sh carries it).

    python -m pytest -q -s tests/gpu/test_flash_impl_gpu.py      # on the device machine
"""

import pytest
import torch

from tunesmith.models import flash_impl
from tunesmith.models.attention import flash_varlen

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or flash_impl.fa4_unavailable(torch.device("cuda")) is not None,
    reason="needs a GPU where FlashAttention 4 runs (flash_impl.fa4_unavailable)")


def _attention_and_grads(attention, q, k, v, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("causal, kv_heads", [(True, 8), (False, 16)])
def test_fa4_matches_pytorchs_flash_attention_2(causal, kv_heads):
    torch.manual_seed(0)
    cu = torch.tensor([0, 300, 1100, 2048, 2600, 4096], dtype=torch.int32, device="cuda")
    longest = int((cu[1:] - cu[:-1]).max())
    q = torch.randn(4096, 16, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(4096, kv_heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    grad = torch.randn_like(q)
    fa2 = _attention_and_grads(lambda *qkv: torch.ops.aten._flash_attention_forward(
        *qkv, cu, cu, longest, longest, 0.0, causal, False)[0], q, k, v, grad)
    assert flash_impl.activate("fa4", q.device) == "FA4"
    fa4 = _attention_and_grads(lambda *qkv: flash_varlen(*qkv, cu, longest, causal=causal), q, k, v, grad)
    for name, ours, theirs in zip(("out", "dq", "dk", "dv"), fa4, fa2):
        scale = float(theirs.float().abs().max())
        error = float((ours.float() - theirs.float()).abs().max())
        assert error <= 0.02 * scale, f"{name}: FA4 differs from FA2 by {error:.3g} (largest value {scale:.3g})"
