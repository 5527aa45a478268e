"""GPU: with FlashAttention 4 switched on (models/flash_impl.py) the variable-length attention
(models/attention.flash_varlen) gives the outputs and gradients of PyTorch's built-in FlashAttention-2 within bf16
noise: causal with grouped-query heads (packed rows), non-causal (a vision tower's images), strided inputs as the
attention layers pass them, keys whose segments differ from the queries', and a forward without gradients first.
Needs a Hopper or Blackwell GPU and flash-attn-4 (benchmarks/fa4_bundle.sh carries it).

    python -m pytest -q -s tests/gpu/test_flash_impl_gpu.py      # on the device machine
"""

import pytest
import torch

from tunesmith.models import flash_impl
from tunesmith.models.attention import VARLEN, flash_varlen

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or flash_impl.fa4_unavailable(torch.device("cuda")) is not None,
    reason="needs a GPU where FlashAttention 4 runs (flash_impl.fa4_unavailable)")


@pytest.fixture
def fa4(monkeypatch):
    monkeypatch.setattr(flash_impl, "_fa4", flash_impl._FA4())  # on for this test only
    return lambda: flash_impl.activate("fa4", torch.device("cuda"), VARLEN, varlen=True)


def _attention_and_grads(attention, q, k, v, grad):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(q, k, v)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def _assert_close(fa4, fa2):
    for name, ours, theirs in zip(("out", "dq", "dk", "dv"), fa4, fa2):
        scale = float(theirs.float().abs().max())
        error = float((ours.float() - theirs.float()).abs().max())
        assert error <= 0.02 * scale, f"{name}: FA4 differs from FA2 by {error:.3g} (largest value {scale:.3g})"


@pytest.mark.parametrize("causal, kv_heads, strided", [(True, 8, True), (False, 16, True), (True, 8, False)])
def test_fa4_matches_pytorchs_flash_attention_2(fa4, causal, kv_heads, strided):
    torch.manual_seed(0)
    cu = torch.tensor([0, 300, 1100, 2048, 2600, 4096], dtype=torch.int32, device="cuda")
    longest = int((cu[1:] - cu[:-1]).max())

    def heads(n):  # [N, n, 128]; strided: the transposed view of [1, n, N, 128], as the layers hand it over
        t = torch.randn(1, n, 4096, 128, device="cuda", dtype=torch.bfloat16)
        return t[0].transpose(0, 1) if strided else t[0].transpose(0, 1).contiguous()

    q, k, v = heads(16), heads(kv_heads), heads(kv_heads)
    grad = torch.randn(4096, 16, 128, device="cuda", dtype=torch.bfloat16)
    fa2 = _attention_and_grads(lambda *qkv: torch.ops.aten._flash_attention_forward(
        *qkv, cu, cu, longest, longest, 0.0, causal, False)[0], q, k, v, grad)
    fa4()
    with torch.no_grad():  # a reference model's forward before the first backward
        flash_varlen(q, k, v, cu, longest, causal=causal)
    _assert_close(_attention_and_grads(lambda *qkv: flash_varlen(*qkv, cu, longest, causal=causal), q, k, v, grad),
                  fa2)


def test_fa4_with_key_segments_longer_than_the_queries(fa4):
    """Context parallelism's shape: each segment's queries are the last of its keys (the causal mask aligned to the
    segment's last key, as FlashAttention-2 does)."""
    torch.manual_seed(0)
    cu_q = torch.tensor([0, 200, 700], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 400, 1400], dtype=torch.int32, device="cuda")
    q = torch.randn(700, 16, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1400, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    grad = torch.randn_like(q)
    fa2 = _attention_and_grads(lambda *qkv: torch.ops.aten._flash_attention_forward(
        *qkv, cu_q, cu_k, 500, 1000, 0.0, True, False)[0], q, k, v, grad)
    fa4()
    _assert_close(_attention_and_grads(lambda *qkv: flash_varlen(*qkv, cu_q, 500, cu_seqlens_k=cu_k,
                                                                 max_seqlen_k=1000), q, k, v, grad), fa2)
