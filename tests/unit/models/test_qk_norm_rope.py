"""models/qk_norm_rope.py: the fused q/k heads' RMSNorm + RoPE gives the unfused path (the heads' Triton norm in
Liger's form, then the rotary embedding stored in the input's dtype), outputs and gradients, for autocast (bf16
heads, fp32 weights and angles) and pure bf16, with the angles per row or shared by the rows. Run on the CPU
through Triton's interpreter (TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess); the
layer check in test_rms_norm_triton.py runs it inside a Qwen3 model, and tests/gpu/test_step_sync_gpu.py compiled."""

import os
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb
    from tunesmith.models.qk_norm_rope import qk_norm_rope
    from tunesmith.models.rms_norm_triton import rms_norm

    def case(batch, cos_batch, dtype, weight_dtype, angle_dtype, train_weight=True):
        torch.manual_seed(batch + cos_batch)
        tokens, heads, kv_heads, dim = 7, 4, 2, 16
        norms = [Qwen3RMSNorm(dim, eps=1e-6).to(weight_dtype) for _ in range(2)]
        for norm in norms:
            with torch.no_grad():
                norm.weight.add_(torch.randn(dim, dtype=weight_dtype) * 0.1)
            norm.weight.requires_grad_(train_weight)
        q = (torch.randn(batch, tokens, heads, dim) * 3).to(dtype).requires_grad_()
        k = (torch.randn(batch, tokens, kv_heads, dim) * 3).to(dtype).requires_grad_()
        angles = torch.randn(cos_batch, tokens, dim // 2)
        cos, sin = (f(torch.cat([angles, angles], -1)).to(angle_dtype) for f in (torch.cos, torch.sin))
        dq, dk = torch.randn(batch, tokens, heads, dim), torch.randn(batch, tokens, kv_heads, dim)

        def unfused():
            qn, kn = (rms_norm(x, n.weight, 1e-6, round_normed=dtype != torch.float32) for x, n in zip((q, k), norms))
            qr, kr = apply_rotary_pos_emb(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)
            return qr.transpose(1, 2).to(dtype), kr.transpose(1, 2).to(dtype)

        results = []
        for fn in (unfused, lambda: qk_norm_rope(q, k, norms[0], norms[1], cos, sin)):
            q.grad = k.grad = None
            for norm in norms:
                norm.weight.grad = None
            outs = fn()
            torch.autograd.backward(outs, [dq.to(dtype), dk.to(dtype)])
            grads = [q.grad, k.grad] + [n.weight.grad for n in norms if train_weight]
            results.append([t.detach().float() for t in (*outs, *grads)])
            assert all(t.dtype == dtype for t in outs)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for got, want in zip(results[1], results[0]):
            torch.testing.assert_close(got, want, rtol=tol, atol=tol * 10)

    case(2, 2, torch.bfloat16, torch.float32, torch.float32)     # autocast: bf16 heads, fp32 masters and angles
    case(2, 1, torch.bfloat16, torch.float32, torch.float32)     # one row of angles for every row
    case(1, 1, torch.bfloat16, torch.bfloat16, torch.bfloat16)   # pure bf16
    case(1, 1, torch.float32, torch.float32, torch.float32)      # fp32 training: no rounding
    case(2, 2, torch.bfloat16, torch.float32, torch.float32, train_weight=False)  # frozen norms (LoRA)
    print("ok")
""")


def test_fused_qk_norm_rope_matches_the_unfused_path_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
