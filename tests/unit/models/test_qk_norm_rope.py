"""models/qk_norm_rope.py: Qwen3's q/k norms and RoPE in one kernel give transformers' q_norm, k_norm and
apply_rotary_pos_emb (fp32 exactly; bf16 up to the separate kernels' roundings, which a reference here repeats),
forward and backward, with the q/k heads read from a stacked q/k/v output. Run on the CPU through Triton's
interpreter (TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess); tests/gpu/test_step_sync_gpu.py
runs the compiled kernels."""

import os
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import os
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb
    from tunesmith.models.qk_norm_rope import qk_norm_rope

    device = os.environ.get("CHECK_DEVICE", "cpu")

    def reference(q, k, q_norm, k_norm, cos, sin, dtype):
        '''the separate kernels' numerics: norm rounded after normalising and after the weight, RoPE in fp32'''
        def norm(x, module):
            if dtype == torch.float32:
                return module(x)
            xf = x.float()
            n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + module.variance_epsilon)).to(dtype)
            return (n.float() * module.weight).to(dtype)
        qn, kn = norm(q, q_norm).transpose(1, 2), norm(k, k_norm).transpose(1, 2)
        qr, kr = apply_rotary_pos_emb(qn.float(), kn.float(), cos, sin)
        return qr.transpose(1, 2).to(dtype), kr.transpose(1, 2).to(dtype)

    for dtype, tokens, q_heads, kv_heads, dim in ((torch.float32, 7, 4, 2, 16), (torch.bfloat16, 37, 4, 2, 16),
                                                  (torch.bfloat16, 5, 2, 2, 8)):
        torch.manual_seed(tokens)
        q_norm, k_norm = Qwen3RMSNorm(dim, eps=1e-6).to(device), Qwen3RMSNorm(dim, eps=1e-6).to(device)
        with torch.no_grad():
            q_norm.weight.add_(torch.randn(dim, device=device) * 0.2)
            k_norm.weight.add_(torch.randn(dim, device=device) * 0.2)
        width = (q_heads + 2 * kv_heads) * dim
        stacked = (torch.randn(1, tokens, width, device=device) * 2).to(dtype).requires_grad_()
        positions = torch.arange(tokens, device=device).float()
        freqs = positions[:, None] / (100.0 ** (torch.arange(0, dim, 2, device=device).float() / dim))[None, :]
        angles = torch.cat([freqs, freqs], -1)[None]
        cos, sin = angles.cos(), angles.sin()
        dq = torch.randn(tokens, q_heads, dim, device=device).to(dtype)
        dk = torch.randn(tokens, kv_heads, dim, device=device).to(dtype)
        results = []
        for fused in (False, True):
            stacked.grad = q_norm.weight.grad = k_norm.weight.grad = None
            q_part, k_part, _ = stacked.split([q_heads * dim, kv_heads * dim, kv_heads * dim], -1)
            if fused:
                qk = stacked[0, :, :(q_heads + kv_heads) * dim].view(tokens, q_heads + kv_heads, dim)
                q, k = qk_norm_rope(qk, q_norm.weight, k_norm.weight, cos, sin, q_heads, 1e-6)
            else:
                q, k = reference(q_part.view(1, tokens, q_heads, dim), k_part.view(1, tokens, kv_heads, dim),
                                 q_norm, k_norm, cos, sin, dtype)
                q, k = q[0], k[0]
            assert q.dtype == k.dtype == dtype and q.shape == dq.shape and k.shape == dk.shape
            torch.autograd.backward([q, k], [dq, dk])
            results.append([q.detach(), k.detach(), stacked.grad, q_norm.weight.grad, k_norm.weight.grad])
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        for name, got, want in zip(("q", "k", "stacked grad", "q_norm grad", "k_norm grad"), results[1], results[0]):
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * (10 if "norm" in name else 1),
                                       msg=lambda m: f"{dtype} {name}: {m}")
        assert results[1][2][..., (q_heads + kv_heads) * dim:].abs().max() == 0  # v's columns untouched
    print("ok")
""")


def test_qk_norm_rope_matches_transformers_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
