"""GPU: the output layer's fused row kernel (models/ce_rows.py) and fp32 in-matmul weight-gradient accumulation
give the eager path's loss and gradients at the Qwen3-1.7B head's shape, under bf16 autocast with fp32 weights.

    python -m pytest -q -s tests/gpu/test_linear_ce_gpu.py      # on the device machine
"""

import pytest
import torch

from tunesmith.models import ce_rows
from tunesmith.models.linear_ce import linear_cross_entropy_sum

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _loss_and_grads(x, w, t, fused: bool, monkeypatch):
    monkeypatch.setattr(ce_rows, "available", lambda device: fused)
    x.grad = w.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = linear_cross_entropy_sum(x, w, t)
    (loss / 1000).backward()
    return loss.detach(), x.grad.clone(), w.grad.clone()


def test_fused_head_matches_the_eager_head(monkeypatch):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(12000, 2048, device="cuda", generator=gen) * 0.5).requires_grad_()  # two chunks of counted rows
    w = (torch.randn(151936, 2048, device="cuda", generator=gen) * 0.02).requires_grad_()
    t = torch.randint(0, 151936, (12000,), device="cuda", generator=gen)
    t[:2000] = -100
    eager = _loss_and_grads(x, w, t, False, monkeypatch)
    fused = _loss_and_grads(x, w, t, True, monkeypatch)
    assert abs(float(fused[0] - eager[0])) / float(eager[0]) < 1e-5
    for a, b in zip(fused[1:], eager[1:]):
        assert a.dtype == b.dtype == torch.float32
        assert float((a - b).norm() / b.norm()) < 1e-2  # bf16 rounding of the product, now avoided (fp32 epilogue)
    assert fused[1][:2000].abs().max() == 0
