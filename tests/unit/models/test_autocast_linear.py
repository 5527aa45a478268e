"""models/autocast_linear.py: under bf16 autocast over fp32 weights the patched nn.Linear gives autocast's
output and its gradients (fp32, within one bf16 rounding), with or without kernels.share_input_casts in front of
it, and leaves every other case to nn.Linear."""

import pytest
import torch

from tunesmith.models.autocast_linear import use_autocast_linears
from tunesmith.models.kernels import share_input_casts


def _layers(bias: bool):
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"q": torch.nn.Linear(32, 48, bias=bias), "k": torch.nn.Linear(32, 16, bias=bias),
                                "o": torch.nn.Linear(48, 32, bias=bias)})


def _run(layers, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        normed = x * 2.0  # fp32, read by q and k as a norm's output is
        out = layers["o"](layers["q"](normed)) + layers["k"](normed).sum()
    out.float().square().sum().backward()
    return out


@pytest.mark.parametrize("shared_casts", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_output_and_gradients_match_autocast(bias, shared_casts):
    reference, patched = _layers(bias), _layers(bias)
    assert use_autocast_linears(patched) == 3
    if shared_casts:  # as make_model installs them: q and k get one bf16 cast of their input
        share_input_casts(reference), share_input_casts(patched)
    x_ref = torch.randn(2, 5, 32, requires_grad=True)
    x_new = x_ref.detach().clone().requires_grad_(True)
    expected, got = _run(reference, x_ref), _run(patched, x_new)
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the forward is autocast's, bit for bit
    assert x_new.grad.dtype == torch.float32
    torch.testing.assert_close(x_new.grad, x_ref.grad, rtol=2e-2, atol=1e-3)
    for name, layer in patched.items():
        for param_name, param in layer.named_parameters():
            assert param.grad.dtype == torch.float32
            torch.testing.assert_close(param.grad, reference[name].get_parameter(param_name).grad, rtol=2e-2,
                                       atol=1e-3)


def test_other_cases_keep_nn_linear():
    layers = _layers(True)
    use_autocast_linears(layers)
    x = torch.randn(3, 32)
    assert layers["q"](x).dtype == torch.float32  # no autocast
    layers["k"].requires_grad_(False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layers["k"](x)  # frozen: nn.Linear's path under autocast
    assert out.grad_fn is None or "AutocastLinear" not in type(out.grad_fn).__name__
    layers["o"].to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "AutocastLinear" not in type(layers["o"](torch.randn(3, 48)).grad_fn).__name__
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.inference_mode():
        assert layers["q"](torch.randn(3, 32)).grad_fn is None  # no gradients: nn.Linear's path
