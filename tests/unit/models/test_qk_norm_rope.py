"""models/qk_norm_rope.py: Qwen3's q/k norms and RoPE in one kernel give transformers' q_norm, k_norm and
apply_rotary_pos_emb (fp32 exactly; bf16 up to the separate kernels' roundings, which a reference here repeats),
forward and backward, with the q/k heads read from a stacked q/k/v output. Run on the CPU through Triton's
interpreter (TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess); tests/gpu/test_step_sync_gpu.py
runs the compiled kernels."""

import textwrap

from conftest import run_interpreted

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
    run_interpreted(CHECK)


ATTENTION_CHECK = textwrap.dedent("""
    import functools, os
    import torch, transformers
    from tunesmith.models import norms, qk_norm_rope
    from tunesmith.models.fused_projections import fuse_projections

    device = os.environ.get("CHECK_DEVICE", "cpu")
    norms._on_triton = lambda hidden: True  # the interpreter stands in for CUDA

    def tiny(**extra):
        config = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=50,
                                          use_cache=False, **extra)
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device)
        for layer in model.model.layers:  # q/k norms as models/norms.use_fused_rms_norms leaves them
            for name in ("q_norm", "k_norm"):
                norm = getattr(layer.self_attn, name)
                with torch.no_grad():
                    norm.weight.add_(torch.randn(16, device=device) * 0.3)
                norm.forward = functools.partial(norms.norm_forward, norm, fallback=type(norm).forward.__get__(norm),
                                                 half_output=False)
        return model

    def loss_and_grads(model, ids, mask, positions):
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, position_ids=positions, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}

    calls, kernel = [], qk_norm_rope.qk_norm_rope
    qk_norm_rope.qk_norm_rope = lambda *a: calls.append(a[3].shape[0]) or kernel(*a)
    ids = torch.randint(0, 50, (2, 9), device=device)
    mask = torch.ones(2, 9, dtype=torch.long, device=device)
    mask[1, :3] = 0  # a left-padded row
    per_row = (mask.cumsum(-1) - 1).clamp_min(0)
    shared = torch.arange(9, device=device)[None]  # one row of positions for the batch: cos/sin [1, T, D]
    for extra in ({}, {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0}):
        plain, fused = tiny(**extra), tiny(**extra)
        assert fuse_projections(fused) == 2 * 2
        for positions in (per_row, shared):
            calls.clear()
            want, got = loss_and_grads(plain, ids, mask, positions), loss_and_grads(fused, ids, mask, positions)
            assert calls == [positions.shape[0]] * 2, calls  # each layer's q/k through the one kernel
            torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
            assert got[1].keys() == want[1].keys()
            for name, grad in want[1].items():
                error = float((got[1][name] - grad).norm() / grad.norm().clamp_min(1e-12))
                assert error < 5e-2, (extra, name, error)
    print("ok")
""")


def test_the_qwen3_attention_with_stacked_qkv_and_one_qk_kernel_trains_as_before():
    """models/fused_projections' Qwen3 attention forward (stacked q/k/v, the one q/k norm + RoPE kernel, then
    transformers' attention) against transformers' own, under bf16 autocast: a batch of two rows, one left-padded,
    with positions per row and shared by the batch, with and without sliding-window layers."""
    run_interpreted(ATTENTION_CHECK)
