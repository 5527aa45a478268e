"""models/linear_ce.py: the chunked output layer + cross-entropy equals logits -> cross_entropy(sum)."""

import pytest
import torch

from tunesmith.models import linear_ce
from tunesmith.models.linear_ce import linear_cross_entropy_sum


def _reference(x, w, t):
    logits = x @ w.T
    return torch.nn.functional.cross_entropy(logits if logits.dtype == torch.float64 else logits.float(), t,
                                             ignore_index=-100, reduction="sum")


@pytest.mark.parametrize("rows", [1, 3, 64])  # many chunks, a ragged last chunk, one chunk
def test_loss_and_gradients_match_plain_cross_entropy(monkeypatch, rows):
    monkeypatch.setattr(linear_ce, "chunk_rows", lambda vocab, dtype: rows)
    torch.manual_seed(0)
    x = torch.randn(13, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(31, 8, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 31, (13,))
    t[[0, 5, 6]] = -100
    ours = linear_cross_entropy_sum(x, w, t)
    (gx, gw) = torch.autograd.grad(3.0 * ours, (x, w))
    ref = _reference(x, w, t)
    (rx, rw) = torch.autograd.grad(3.0 * ref, (x, w))
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(gx, rx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, rw, rtol=1e-4, atol=1e-5)
    assert gx[[0, 5, 6]].abs().max() == 0  # uncounted tokens get no gradient


def test_weight_only_or_no_gradient():
    x = torch.randn(5, 4)
    w = torch.randn(7, 4, requires_grad=True)
    t = torch.tensor([1, 2, -100, 3, 4])
    (gw,) = torch.autograd.grad(linear_cross_entropy_sum(x, w, t), (w,))
    (rw,) = torch.autograd.grad(_reference(x, w, t), (w,))
    torch.testing.assert_close(gw, rw)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy_sum(x, w, t), _reference(x, w, t))


def test_bf16_autocast_runs_matmuls_in_bf16_and_keeps_grad_dtypes():
    x = torch.randn(6, 16, requires_grad=True)
    w = torch.randn(40, 16, requires_grad=True)
    t = torch.randint(0, 40, (6,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy_sum(x, w, t)
    loss.backward()
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    ref = _reference(x.detach().bfloat16().float(), w.detach().bfloat16().float(), t)
    assert abs(float(loss) - float(ref)) / float(ref) < 1e-2


def test_chunk_rows_fits_the_budget():
    assert linear_ce.chunk_rows(151936, torch.bfloat16) == 2 * 1024**3 // (151936 * 6)
    assert linear_ce.chunk_rows(10**12, torch.float32) == 1
