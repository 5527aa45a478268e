"""models/rms_norm_triton.py: the Triton RMSNorm's output and gradients equal transformers' RMSNorm (Llama's form)
for the dtypes a run meets. Run on the CPU through Triton's interpreter (TRITON_INTERPRET=1, set before Triton is
imported, hence a subprocess); tests/gpu/test_step_sync_gpu.py runs the compiled kernels against it on a GPU."""

import os
import subprocess
import sys
import textwrap

CHECK = textwrap.dedent("""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    from tunesmith.models.rms_norm_triton import rms_norm

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
    print("ok")
""")


def test_triton_rms_norm_matches_transformers_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr
