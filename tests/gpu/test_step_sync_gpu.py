"""GPU: a step's values reach the host without waiting for work queued after them (train/step_values.py), the
device-side clipping and skipping of a fused AdamW (engines/local_step.py) equal clip_grad_norm_ + step, and
PyTorch's fused RMSNorm (models/norms.py) gives transformers' under bf16 autocast, and so does the autocast
linear (models/autocast_linear.py).

    python -m pytest -q -s tests/gpu/test_step_sync_gpu.py      # on the device machine
"""

import time

import pytest
import torch

from tunesmith.engines.base import StepOutput, StepResult
from tunesmith.engines.local_step import clip_and_step
from tunesmith.train.step_values import StepValues

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_values_are_read_without_waiting_for_later_work():
    out = StepOutput(torch.tensor(2.5, device="cuda"), {"n": torch.tensor(3.0, device="cuda")}, 4)
    values = StepValues([out], [StepResult(torch.tensor(0.75, device="cuda"), torch.tensor(False, device="cuda"),
                                           1e-5)])
    torch.cuda._sleep(int(3e9))  # about two seconds of GPU work queued after the step
    started = time.perf_counter()
    outs, results = values.read()
    waited = time.perf_counter() - started
    torch.cuda.synchronize()
    assert waited < 0.5, f"read() waited {waited:.2f} s for work queued after the step"
    assert (outs[0].loss, outs[0].sums, outs[0].count) == (2.5, {"n": 3.0}, 4)
    assert (results[0].grad_norm, results[0].skipped) == (0.75, False)


@pytest.mark.parametrize("scale", [10.0, 0.01])
def test_device_step_equals_clip_grad_norm_then_step(scale):
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8)).cuda()
        for p in model.parameters():
            p.grad = torch.randn_like(p) * scale
        return model, torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)

    model, optimizer = build()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    result = clip_and_step(model, optimizer, scheduler, None, max_grad_norm=1.0, skip_nonfinite=False,
                           nonfinite_loss=torch.tensor(False, device="cuda"))
    reference, ref_optimizer = build()
    norm = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0)
    ref_optimizer.step()
    assert result.grad_norm.is_cuda and float(result.grad_norm) == pytest.approx(float(norm), rel=1e-6)
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_fused_rms_norm_matches_transformers_under_autocast():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from tunesmith.models.norms import fused_rms_norm

    torch.manual_seed(0)
    for hidden_dtype, size in ((torch.float32, 2048), (torch.bfloat16, 128)):
        norm = Qwen3RMSNorm(size).cuda()
        with torch.no_grad():
            norm.weight.add_(torch.randn(size, device="cuda") * 0.1)
        hidden = torch.randn(4096, size, device="cuda", dtype=hidden_dtype, requires_grad=True)
        grads = []
        for fn in (norm, lambda h: fused_rms_norm(norm, h)):
            hidden.grad = norm.weight.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = fn(hidden)
            y.backward(torch.ones_like(y))
            grads.append((y.detach(), hidden.grad.clone(), norm.weight.grad.clone()))
        (y, dx, dw), (hf_y, hf_dx, hf_dw) = grads[1], grads[0]
        assert y.dtype == dx.dtype == hidden_dtype and dw.dtype == torch.float32
        tolerance = 1e-2 if hidden_dtype == torch.bfloat16 else 1e-5  # bf16 rounding of the heads' output
        for got, expected in ((y, hf_y), (dx, hf_dx), (dw, hf_dw)):
            error = float((got.float() - expected.float()).norm() / expected.float().norm())
            assert error < tolerance, (hidden_dtype, error)


@pytest.mark.parametrize("bias", [False, True])
def test_autocast_linear_matches_autocast_on_cuda(bias):
    """models/autocast_linear.py on CUDA (its backward writes fp32 through torch.mm(out_dtype=)): autocast's
    output exactly, and its gradients within one bf16 rounding (the GEMMs' fp32 sums, not rounded to bf16)."""
    from tunesmith.models.autocast_linear import use_autocast_linears

    torch.manual_seed(0)
    reference = torch.nn.Linear(2048, 1024, bias=bias, device="cuda")
    patched = torch.nn.Linear(2048, 1024, bias=bias, device="cuda")
    patched.load_state_dict(reference.state_dict())
    use_autocast_linears(patched)
    x = torch.randn(3, 700, 2048, device="cuda")
    grads = []
    for layer in (reference, patched):
        leaf = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(leaf * 2.0)
        out.float().square().sum().backward()
        grads.append((out, leaf.grad, layer.weight.grad, layer.bias.grad if bias else None))
    (out_ref, gx_ref, gw_ref, gb_ref), (out_new, gx_new, gw_new, gb_new) = grads
    torch.testing.assert_close(out_new, out_ref, rtol=0, atol=0)
    for got, expected in ((gx_new, gx_ref), (gw_new, gw_ref)) + (((gb_new, gb_ref),) if bias else ()):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=1.6e-2, atol=1e-2 * expected.abs().max().item())


@pytest.mark.parametrize("rows,size,hidden_dtype,out_dtype", [(8192, 2048, torch.float32, torch.bfloat16),
                                                              (8192, 2048, torch.float32, torch.float32),
                                                              (8192 * 16, 128, torch.bfloat16, torch.bfloat16),
                                                              (8192, 2048, torch.bfloat16, torch.bfloat16)])
def test_triton_rms_norm_matches_transformers_on_cuda(rows, size, hidden_dtype, out_dtype):
    """models/rms_norm_triton.py compiled, on issue 15's shapes (a pre-norm over the fp32 residual stream writing
    bf16 or fp32; the q/k heads in bf16; pure bf16): transformers' RMSNorm under autocast, within one rounding of
    the output dtype, its gradients too (the weight's summed over 8k-131k rows)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from tunesmith.models.rms_norm_triton import rms_norm

    torch.manual_seed(0)
    weight_dtype = torch.bfloat16 if hidden_dtype == out_dtype == torch.bfloat16 and size > 128 else torch.float32
    norm = Qwen3RMSNorm(size).cuda().to(weight_dtype)
    with torch.no_grad():
        norm.weight.add_(torch.randn(size, device="cuda", dtype=weight_dtype) * 0.1)
    hidden = (torch.randn(rows, size, device="cuda") * 2).to(hidden_dtype).requires_grad_(True)
    dy = torch.randn(rows, size, device="cuda")
    results = []
    for fn in (norm, lambda h: rms_norm(h, norm.weight, norm.variance_epsilon, out_dtype=out_dtype,
                                        round_normed=size <= 128)):
        hidden.grad = norm.weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn(hidden)
        y.backward(dy.to(y.dtype))
        results.append((y.detach(), hidden.grad.clone(), norm.weight.grad.clone()))
    (hf_y, hf_dx, hf_dw), (y, dx, dw) = results
    assert y.dtype == out_dtype and dx.dtype == hidden_dtype and dw.dtype == weight_dtype
    tolerance = 1e-5 if torch.float32 in (hidden_dtype,) and out_dtype == torch.float32 else 1e-2
    for got, expected in ((y, hf_y), (dx, hf_dx), (dw, hf_dw)):
        error = float((got.float() - expected.float()).norm() / expected.float().norm())
        assert error < tolerance, (hidden_dtype, out_dtype, error)


@pytest.mark.parametrize("residual_dtype,out_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, None)])
def test_triton_add_rms_norm_matches_the_add_then_the_norm_on_cuda(residual_dtype, out_dtype):
    """rms_norm_triton.add_rms_norm compiled, issue 15's shape: the residual stream plus a bf16 attention output, and
    its norm under autocast (bf16 out) or in pure bf16, against `residual + branch` then transformers' RMSNorm; the
    gradients of both inputs (each in its own dtype) and of the weight."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from tunesmith.models.rms_norm_triton import add_rms_norm

    torch.manual_seed(0)
    norm = Qwen3RMSNorm(2048).cuda().to(torch.float32 if out_dtype else residual_dtype)
    with torch.no_grad():
        norm.weight.add_(torch.randn_like(norm.weight) * 0.1)
    residual = (torch.randn(8192, 2048, device="cuda") * 3).to(residual_dtype).requires_grad_(True)
    branch = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    d_sum, dy = torch.randn(8192, 2048, device="cuda"), torch.randn(8192, 2048, device="cuda")
    results = []
    for fused in (False, True):
        residual.grad = branch.grad = norm.weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            if fused:
                total, y = add_rms_norm(residual, branch, norm.weight, norm.variance_epsilon, out_dtype=out_dtype)
            else:
                total = residual + branch
                y = norm(total)
        torch.autograd.backward([total, y], [d_sum.to(total.dtype), dy.to(y.dtype)])
        results.append([t.detach().float() for t in (total, y, residual.grad, branch.grad, norm.weight.grad)])
    for got, expected in zip(results[1], results[0]):
        error = float((got - expected).norm() / expected.norm())
        assert error < (1e-5 if residual_dtype == torch.float32 and got.shape != () and out_dtype is None else 1e-2)


def _run_unit_check(file: str, name: str) -> None:
    """Run the CHECK script `name` of tests/unit/models/`file` with its kernels compiled, on this machine's GPU."""
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).parents[1] / "unit" / "models" / file
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = {**os.environ, "CHECK_DEVICE": "cuda"}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", getattr(module, name)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


def test_the_fused_decoder_layers_give_transformers_layers_on_cuda():
    """tests/unit/models/test_rms_norm_triton.py's layer check with the kernels compiled, on this machine's
    transformers: a Qwen3 model's loss and gradients with each residual add fused with the norm after it (handed
    to the next layer's norm), with a hook that replaces a layer's output, with a checkpointed layer, and with
    q/k/v and gate/up stacked and the q/k norms and RoPE in one kernel (models/fused_projections.py)."""
    _run_unit_check("test_rms_norm_triton.py", "LAYER_CHECK")


def test_the_triton_rms_norm_checks_pass_on_cuda():
    """tests/unit/models/test_rms_norm_triton.py's kernel check compiled: the dtypes a run meets, heads read in place
    from a stacked q/k/v output (the other families' q/k norms), the residual add with its norm."""
    _run_unit_check("test_rms_norm_triton.py", "CHECK")


def test_qk_norm_rope_matches_transformers_on_cuda():
    """tests/unit/models/test_qk_norm_rope.py's check with the kernels compiled."""
    _run_unit_check("test_qk_norm_rope.py", "CHECK")


def test_the_stacked_qwen3_attention_trains_as_before_on_cuda():
    """tests/unit/models/test_qk_norm_rope.py's attention check with the kernels compiled."""
    _run_unit_check("test_qk_norm_rope.py", "ATTENTION_CHECK")
