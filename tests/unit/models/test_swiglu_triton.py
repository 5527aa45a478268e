"""models/swiglu_triton.py: silu(gate) * up of a fused [gate, up] tensor and its gradient equal PyTorch's form, for
the dtypes a run meets and widths that do and do not fill the kernel's block. Run on the CPU through Triton's
interpreter (TRITON_INTERPRET=1, set before Triton is imported, hence a subprocess);
tests/gpu/test_megatron_fused_gpu.py runs the compiled kernels on a GPU."""

import textwrap

from conftest import run_interpreted

CHECK = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from tunesmith.models.swiglu_triton import swiglu

    for shape, dtype in (((3, 2, 2 * 1536), torch.float32), ((5, 2 * 40), torch.bfloat16), ((0, 8), torch.float32)):
        torch.manual_seed(shape[-1])
        x = (torch.randn(shape) * 3).to(dtype).requires_grad_()
        dy = torch.randn(*shape[:-1], shape[-1] // 2).to(dtype)
        gate, up = torch.chunk(x.float(), 2, dim=-1)
        want = F.silu(gate) * up
        want_grad, = torch.autograd.grad(want, x, dy.float())
        got = swiglu(x)
        got.backward(dy)
        assert got.dtype == dtype and x.grad.dtype == dtype and got.shape == want.shape
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(x.grad.float(), want_grad.float(), rtol=tol, atol=tol)
    try:
        swiglu(torch.zeros(2, 3))
    except ValueError as error:
        assert "even last dimension" in str(error)
    else:
        raise AssertionError("an odd width was accepted")
    print("ok")
""")


def test_triton_swiglu_matches_pytorch_in_the_interpreter():
    run_interpreted(CHECK)
