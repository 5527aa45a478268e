"""models/rms_norm_triton.py: the Triton RMSNorm's output and gradients equal transformers' RMSNorm (Llama's form)
for the dtypes a run meets, and the fused residual add + RMSNorm equals the add then the norm; norms.py's decoder
layer forward equals transformers' layer. Run on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set before Triton is
imported, hence a subprocess); tests/gpu/test_step_sync_gpu.py runs the compiled kernels against it on a GPU."""

import textwrap

from conftest import run_interpreted

CHECK = textwrap.dedent("""
    import os
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    from tunesmith.models.rms_norm_triton import _rows_in_place, rms_norm

    torch.set_default_device(os.environ.get("CHECK_DEVICE", "cpu"))  # tests/gpu/test_step_sync_gpu.py: cuda

    def case(rows, cols, x_dtype, w_dtype, out_dtype, round_normed, train_weight=True):
        torch.manual_seed(cols + rows)
        norm = Qwen3RMSNorm(cols, eps=1e-6).to(w_dtype)
        with torch.no_grad():
            norm.weight.add_(torch.randn(cols, dtype=w_dtype) * 0.1)
        norm.weight.requires_grad_(train_weight)
        x = (torch.randn(2, rows, cols) * 3).to(x_dtype).requires_grad_()
        dy = torch.randn(2, rows, cols)
        expected = norm(x)
        expected.backward(dy.to(expected.dtype))
        want = (expected.detach(), x.grad.clone(), None if norm.weight.grad is None else norm.weight.grad.clone())
        x.grad, norm.weight.grad = None, None
        got = rms_norm(x, norm.weight, 1e-6, out_dtype=out_dtype, round_normed=round_normed)
        assert got.dtype == (out_dtype or x_dtype), got.dtype
        got.backward(dy.to(got.dtype))
        tol = 1e-5 if x_dtype == torch.float32 and out_dtype in (None, torch.float32) else 2e-2
        torch.testing.assert_close(got.float(), want[0].float(), rtol=tol, atol=tol)
        torch.testing.assert_close(x.grad.float(), want[1].float(), rtol=tol, atol=tol)
        assert x.grad.dtype == x_dtype
        if train_weight:
            assert norm.weight.grad.dtype == w_dtype
            torch.testing.assert_close(norm.weight.grad.float(), want[2].float(), rtol=tol, atol=tol * 10)
        else:
            assert norm.weight.grad is None

    case(37, 96, torch.float32, torch.float32, None, False)              # the residual stream, fp32 out
    case(37, 96, torch.float32, torch.float32, torch.bfloat16, False)    # a pre-norm under autocast: bf16 out
    case(300, 16, torch.bfloat16, torch.float32, None, True)             # q/k heads under autocast (Liger's form)
    case(41, 96, torch.bfloat16, torch.bfloat16, None, False)            # pure bf16
    case(5, 96, torch.float32, torch.float32, None, False, train_weight=False)  # frozen weight (LoRA)

    # q heads read where they lie: a [B, T, H, D] view of a stacked q/k/v output [B, T, (H + 2 Hkv) D]
    torch.manual_seed(7)
    norm = Qwen3RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.add_(torch.randn(16) * 0.1)
    stacked = (torch.randn(2, 5, 8 * 16) * 3).to(torch.bfloat16).requires_grad_()
    dy = torch.randn(2, 5, 4, 16).to(torch.bfloat16)
    results = []
    for norm_of in (norm, lambda x: rms_norm(x, norm.weight, 1e-6, round_normed=True)):
        stacked.grad, norm.weight.grad = None, None
        q = stacked[..., :64].view(2, 5, 4, 16)
        assert not q.is_contiguous() and _rows_in_place(q)[1:] == (4, 128)  # no copy: groups of 4 rows
        out = norm_of(q)
        out.backward(dy)
        results.append((out.detach().float(), stacked.grad.float(), norm.weight.grad.clone()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert results[1][1][..., 64:].abs().max() == 0

    from tunesmith.models.rms_norm_triton import add_rms_norm

    for residual_dtype, branch_dtype, out_dtype in ((torch.float32, torch.bfloat16, torch.bfloat16),
                                                    (torch.bfloat16, torch.bfloat16, None)):
        torch.manual_seed(1)
        norm = Qwen3RMSNorm(96, eps=1e-6).to(residual_dtype if out_dtype is None else torch.float32)
        residual = torch.randn(3, 7, 96).to(residual_dtype).requires_grad_()
        branch = torch.randn(3, 7, 96).to(branch_dtype).requires_grad_()
        d_sum, dy = torch.randn(3, 7, 96), torch.randn(3, 7, 96)
        total = residual + branch
        expected = norm(total)
        torch.autograd.backward([total, expected], [d_sum.to(total.dtype), dy.to(expected.dtype)])
        want = [t.detach().float() for t in (total, expected, residual.grad, branch.grad, norm.weight.grad)]
        residual.grad = branch.grad = norm.weight.grad = None
        got_total, got = add_rms_norm(residual, branch, norm.weight, 1e-6, out_dtype=out_dtype)
        assert got_total.dtype == residual_dtype and got.dtype == (out_dtype or residual_dtype)
        torch.autograd.backward([got_total, got], [d_sum.to(got_total.dtype), dy.to(got.dtype)])
        assert residual.grad.dtype == residual_dtype and branch.grad.dtype == branch_dtype
        tol = 2e-2 if torch.bfloat16 in (residual_dtype, out_dtype) else 1e-5
        for g, w in zip((got_total, got, residual.grad, branch.grad, norm.weight.grad), want):
            torch.testing.assert_close(g.detach().float(), w, rtol=tol, atol=tol * 10)
    print("ok")
""")


def test_triton_rms_norm_matches_transformers_in_the_interpreter():
    run_interpreted(CHECK)


LAYER_CHECK = textwrap.dedent("""
    import os, sys, types
    import torch
    import transformers
    from transformers.models.qwen3 import modeling_qwen3
    from tunesmith.models import norms

    sys.modules["liger_kernel.transformers.rms_norm"] = types.SimpleNamespace(LigerRMSNorm=modeling_qwen3.Qwen3RMSNorm)
    modeling_qwen3.Qwen3RMSNorm.offset, modeling_qwen3.Qwen3RMSNorm.casting_mode = 0.0, "llama"
    norms.TRITON_NORMS = True
    norms._on_triton = lambda hidden: True
    config = transformers.Qwen3Config(hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=64,
                                      use_cache=False)  # as models/load.py sets it for training
    from tunesmith.models import rms_norm_triton
    calls = []
    fused_add = rms_norm_triton.add_rms_norm
    rms_norm_triton.add_rms_norm = lambda *a, **k: calls.append(a) or fused_add(*a, **k)
    torch.manual_seed(0)
    plain = modeling_qwen3.Qwen3ForCausalLM(config)
    fused = modeling_qwen3.Qwen3ForCausalLM(config)
    fused.load_state_dict(plain.state_dict())
    assert norms.use_fused_rms_norms(fused) == 2 * 4 + 1
    device = os.environ.get("CHECK_DEVICE", "cpu")  # tests/gpu/test_step_sync_gpu.py runs it compiled on cuda
    plain.to(device), fused.to(device)
    assert all(isinstance(layer.forward, __import__("functools").partial) for layer in fused.model.layers)
    ids = torch.randint(0, 64, (2, 9), device=device)

    def loss_and_grads(model):
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters()}

    def same(got, want):
        torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
        for name, grad in want[1].items():
            error = float((got[1][name] - grad).norm() / grad.norm().clamp_min(1e-12))
            assert error < 5e-2, (name, error)

    want = loss_and_grads(plain)
    same(loss_and_grads(fused), want)
    assert len(calls) == 4  # a layer's two adds, each with the norm after it (the last: the final norm)
    assert not any(norms.HANDOFF in vars(m) for m in fused.modules())  # every handed-off output was taken

    # a hook that replaces layer 0's output: the next input norm computes its own
    calls.clear()
    hook = fused.model.layers[0].register_forward_hook(lambda module, args, out: out * 1.0)
    same(loss_and_grads(fused), want)
    hook.remove()
    assert len(calls) == 4 and not any(norms.HANDOFF in vars(m) for m in fused.modules())

    # a checkpointed layer is recomputed (whether transformers checkpoints in __call__ or in the class's forward),
    # and it neither hands off nor is handed to: a recompute must take the first pass's path
    calls.clear()
    fused.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fused.model.layers[1].gradient_checkpointing = False  # layer 0 checkpointed, layer 1 hands off to the final norm
    attention_calls = [0, 0]
    for i, layer in enumerate(fused.model.layers):
        layer.self_attn.register_forward_pre_hook(lambda *_, i=i: attention_calls.__setitem__(i, attention_calls[i] + 1))
    same(loss_and_grads(fused), want)
    assert attention_calls == [2, 1], attention_calls
    weights = [call[2] for call in calls]
    assert sum(w is fused.model.norm.weight for w in weights) == 1
    assert not any(w is fused.model.layers[1].input_layernorm.weight for w in weights)

    # q/k/v and gate/up stacked on top (models/fused_projections), with layer 0 checkpointed and then without: the
    # same loss and gradients
    # and Qwen3's q/k norms and RoPE in one kernel (models/qk_norm_rope) reading the heads from the stacked output
    from tunesmith.models import qk_norm_rope as fused_rope
    from tunesmith.models.fused_projections import fuse_projections
    rope_calls, rope = [], fused_rope.qk_norm_rope
    fused_rope.qk_norm_rope = lambda *a: rope_calls.append(a) or rope(*a)
    assert fuse_projections(fused) == 2 * 2
    same(loss_and_grads(fused), want)
    assert len(rope_calls) == 3  # layer 0 checkpointed: its forward and its recompute, then layer 1
    fused.gradient_checkpointing_disable()
    same(loss_and_grads(fused), want)
    assert len(rope_calls) == 5
    print("ok")
""")


def test_the_fused_decoder_layer_gives_transformers_layer_in_the_interpreter():
    """norms.use_fused_rms_norms on a Qwen3 model (transformers' RMSNorm standing in for Liger's): every norm and
    every layer's forward replaced, and under bf16 autocast the loss and every gradient those of the model without."""
    run_interpreted(LAYER_CHECK, timeout=900)
