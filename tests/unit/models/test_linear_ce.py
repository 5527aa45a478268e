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
    monkeypatch.setattr(linear_ce, "chunk_rows", lambda vocab, dtype, **kw: rows)
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


def test_twenty_training_steps_follow_the_logits_path():
    """Issue 15: the fast path's per-step loss within 1% of the plain logits + cross-entropy path for 20 steps."""
    from transformers import AutoModelForCausalLM

    from tunesmith.models.tiny import build_tiny

    def run(fused: bool) -> list[float]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(build_tiny("qwen3"), dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        data = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(20):
            ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=data)
            targets = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], 1)
            targets[:, :10] = -100  # a prompt
            hidden = model.model(input_ids=ids).last_hidden_state.reshape(-1, model.config.hidden_size)
            flat = targets.reshape(-1)
            if fused:
                total = linear_cross_entropy_sum(hidden, model.lm_head.weight, flat)
            else:
                total = _reference(hidden, model.lm_head.weight, flat)
            loss = total / (flat != -100).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss))
        return losses

    for fast, slow in zip(run(True), run(False), strict=True):
        assert abs(fast - slow) / slow < 0.01


_KERNEL_CHECK = """
import torch
from tunesmith.models import ce_rows
from tunesmith.models.linear_ce import _nll_and_grad_eager
torch.manual_seed(0)
for dtype in (torch.float32, torch.bfloat16):
    logits = (torch.randn(5, 9000) * 3).to(dtype)  # 9,000 columns: two full blocks and a ragged third
    t = torch.tensor([1, 8999, -100, 4096, 0])
    ref_total, ref_grad = _nll_and_grad_eager(logits.clone(), t, True)
    nll = ce_rows.nll_and_grad_(logits, t, grad=True)
    assert nll[2] == 0 and logits[2].abs().max() == 0, "an uncounted row has no loss and no gradient"
    torch.testing.assert_close(nll.sum(), ref_total, rtol=1e-6, atol=1e-4)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 1e-6  # rounding of exp() may differ by one unit
    assert (logits.float() - ref_grad.float()).abs().max() <= ulp
print("ok")
"""


def test_fused_row_kernel_matches_the_eager_path():
    """models/ce_rows.py's Triton kernel, run by Triton's interpreter on the CPU, gives the eager path's NLL and
    gradient (in place), for fp32 and bf16 logits and an uncounted row."""
    from conftest import run_interpreted

    pytest.importorskip("triton")
    run_interpreted(_KERNEL_CHECK, timeout=300)


def test_rows_found_by_the_collator_give_the_same_loss():
    """The collator's counted_rows (found on the CPU, no host wait on a GPU) select the same rows as the loss's
    own search."""
    from tunesmith.data.collate import collate_rows
    from tunesmith.models.linear_ce import linear_cross_entropy_sum

    rows = [[{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}, {"input_ids": [9, 10, 11], "labels": [9, 10, 11]}],
            [{"input_ids": [12, 13], "labels": [-100, 13]}]]
    batch = collate_rows(rows, pad_id=0)
    torch.manual_seed(0)
    hidden, weight = torch.randn(batch.targets_BT.numel(), 16), torch.randn(40, 16)
    targets = batch.targets_BT.reshape(-1)
    assert batch.counted_rows.tolist() == (targets != -100).nonzero().squeeze(1).tolist()
    torch.testing.assert_close(linear_cross_entropy_sum(hidden, weight, targets, batch.counted_rows),
                               linear_cross_entropy_sum(hidden, weight, targets))
