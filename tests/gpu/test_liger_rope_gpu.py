"""GPU: the pinned Triton RoPE (models/liger_rope.py) gives Liger's dispatched RoPE's outputs and gradients, as a
Qwen3 attention layer calls it. Needs liger-kernel.

    python -m pytest -q -s tests/gpu/test_liger_rope_gpu.py      # on the device machine
"""

import pytest
import torch

liger_rope = pytest.importorskip("liger_kernel.transformers.rope")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_pinned_triton_rope_matches_the_dispatched_one(monkeypatch):
    from transformers.models.qwen3 import modeling_qwen3

    from tunesmith.models.liger_rope import pin_triton_rope

    torch.manual_seed(0)
    q = torch.randn(1, 16, 2048, 128, device="cuda", dtype=torch.bfloat16)  # large enough for Liger's CuTe route
    k = torch.randn(1, 8, 2048, 128, device="cuda", dtype=torch.bfloat16)
    angles = torch.randn(1, 2048, 64, device="cuda").repeat(1, 1, 2)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()

    def run(rope):
        qi, ki = (t.clone().requires_grad_() for t in (q, k))
        out_q, out_k = rope(qi * 1, ki * 1, cos, sin)
        (out_q.float().square().sum() + out_k.float().sum()).backward()
        return [out_q.detach(), out_k.detach(), qi.grad, ki.grad]

    expected = run(liger_rope.liger_rotary_pos_emb)
    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", liger_rope.liger_rotary_pos_emb)
    assert pin_triton_rope("qwen3")
    for ours, theirs in zip(run(modeling_qwen3.apply_rotary_pos_emb), expected):
        torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2)
