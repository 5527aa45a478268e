"""GPU: models/grouped_linear.py's one GEMM for q/k/v and gate/up (cuBLAS's bf16 x bf16 -> fp32 GEMMs) gives the
separate layers' outputs and gradients under bf16 autocast, on a Qwen3-1.7B-sized layer's projections.

    python -m pytest -q -s tests/gpu/test_grouped_linear_gpu.py      # on the device machine
"""

import copy

import pytest
import torch

from tunesmith.models import grouped_linear
from tunesmith.models.autocast_linear import use_autocast_linears
from tunesmith.models.grouped_linear import use_grouped_linears
from tunesmith.models.kernels import share_input_casts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Projections(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(2048, n, bias=False) for n in (2048, 1024, 1024))
        self.gate_proj, self.up_proj = (torch.nn.Linear(2048, 6144, bias=False) for _ in range(2))

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        mlp = torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x)
        return torch.cat([q, k, v, mlp], dim=-1)


@pytest.mark.parametrize("shared_casts", [False, True])
def test_grouped_projections_match_the_separate_layers(monkeypatch, shared_casts):
    monkeypatch.setattr(grouped_linear, "GROUPED_LINEARS", True)
    torch.manual_seed(0)
    reference = _Projections().cuda()
    patched = copy.deepcopy(reference)
    use_autocast_linears(reference), use_autocast_linears(patched)
    assert use_grouped_linears(patched) == 2
    if shared_casts:
        share_input_casts(reference), share_input_casts(patched)
    x = torch.randn(4096, 2048, device="cuda")
    dy = torch.randn(4096, 2048 * 2 + 6144, device="cuda", dtype=torch.bfloat16)
    outs, grads = [], []
    for model in (reference, patched):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(xi)
        out.backward(dy)
        outs.append(out)
        grads.append([xi.grad] + [p.grad for p in model.parameters()])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-2, atol=1e-2 * outs[0].abs().max().item())
    for got, expected in zip(grads[1], grads[0]):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-2 * expected.abs().max().item())
