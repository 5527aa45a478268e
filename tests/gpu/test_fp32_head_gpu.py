"""GPU: cast_lm_head_to_fp32's CUDA path (models/fp32_head.py): one bf16 GEMM writing fp32 sums gives the widened
operands' fp32 product, and the head's gradients are autocast's.

    python -m pytest -q tests/gpu/test_fp32_head_gpu.py      # on the device machine
"""

import pytest
import torch
import torch.nn.functional as F

from tunesmith.models.fp32_head import fp32_logits, half_matmul_fp32

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_half_gemm_with_fp32_output_is_the_widened_product():
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1024, 2048, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(8192, 2048, device="cuda", generator=gen) * 0.02).bfloat16()
    out = half_matmul_fp32(x, w)
    assert out.dtype == torch.float32
    exact = (x.double() @ w.double().t()).float()
    widened = F.linear(x.float(), w.float())  # fp32 on fp32 CUDA cores (no TF32 by default)
    ours, theirs = (out - exact).abs().max(), (widened - exact).abs().max()
    assert ours <= 4 * theirs + 1e-6, (ours, theirs)
    assert (F.linear(x, w).float() - exact).abs().max() > 10 * ours  # the bf16 head rounds far more


def test_under_autocast_the_head_trains_like_autocasts():
    gen = torch.Generator(device="cuda").manual_seed(1)
    hidden = torch.randn(4, 256, 1024, device="cuda", generator=gen, requires_grad=True)
    weight = (torch.randn(4096, 1024, device="cuda", generator=gen) * 0.02).requires_grad_()
    grad = torch.randn(4, 256, 4096, device="cuda", generator=gen)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = fp32_logits(hidden, weight)
    assert logits.dtype == torch.float32
    logits.backward(grad)
    ours = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        F.linear(hidden, weight).backward(grad.bfloat16())
    torch.testing.assert_close(ours[0], hidden.grad, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(ours[1], weight.grad, rtol=2e-2, atol=2e-2)
