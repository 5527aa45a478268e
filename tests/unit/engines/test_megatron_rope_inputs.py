"""engines/megatron/fused.rope_qk leaves its query and key unchanged, in the one-row layout too (B = 1, where
Liger's kernel would rotate the caller's storage in place): megatron-core's selective recomputation runs the core
attention, which calls it, a second time on the same inputs in backward. Liger's Triton kernel runs on the CPU
through Triton's interpreter (TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess);
tests/gpu/test_megatron_fused_gpu.py runs it compiled, against megatron-core's rotary."""

import textwrap

import pytest
from conftest import run_interpreted

CHECK = textwrap.dedent("""
    import torch
    from liger_kernel.ops.rope import LigerRopeFunction
    from tunesmith.engines.megatron import fused

    for batch in (1, 2):
        torch.manual_seed(batch)
        q, k = torch.randn(64, batch, 4, 16), torch.randn(64, batch, 2, 16)
        cos, sin = fused.cos_sin(torch.randn(64, batch, 1, 16))
        before = q.clone(), k.clone()
        got = fused.rope_qk(q, k, cos, sin)
        assert torch.equal(q, before[0]) and torch.equal(k, before[1]), batch
        want = LigerRopeFunction.apply(*(t.clone().permute(1, 2, 0, 3) for t in before), cos, sin)
        assert all(torch.equal(g, w.permute(2, 0, 1, 3)) for g, w in zip(got, want)), batch
    print("ok")
""")


def test_rope_qk_leaves_its_inputs_unchanged():
    pytest.importorskip("liger_kernel")
    pytest.importorskip("megatron.core")
    run_interpreted(CHECK, timeout=300)
