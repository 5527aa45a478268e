"""models/grouped_linear.py: q/k/v (and gate/up) as one GEMM under bf16 autocast give autocast's outputs and its
gradients (within one bf16 rounding), on a layer and on the tiny Qwen3 model's loss; every other case, and a deep
copy, keeps each layer's own weights and path."""

import copy

import pytest
import torch

from tunesmith.models import grouped_linear
from tunesmith.models.autocast_linear import use_autocast_linears
from tunesmith.models.grouped_linear import use_grouped_linears
from tunesmith.models.kernels import share_input_casts


@pytest.fixture
def grouped(monkeypatch):
    monkeypatch.setattr(grouped_linear, "GROUPED_LINEARS", True)


class _Attention(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.q_proj = torch.nn.Linear(32, 48, bias=bias)
        self.k_proj = torch.nn.Linear(32, 16, bias=bias)
        self.v_proj = torch.nn.Linear(32, 16, bias=bias)
        self.o_proj = torch.nn.Linear(48, 32, bias=bias)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(q * k.repeat(1, 1, 3) + v.repeat(1, 1, 3))


def _pair(bias: bool, shared_casts: bool):
    torch.manual_seed(0)
    reference = _Attention(bias)
    patched = copy.deepcopy(reference)
    use_autocast_linears(reference), use_autocast_linears(patched)
    assert use_grouped_linears(patched) == 1
    if shared_casts:
        share_input_casts(reference), share_input_casts(patched)
    return reference, patched


def _run(module, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x * 2.0)
    out.float().square().sum().backward()
    return out


@pytest.mark.parametrize("shared_casts", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_outputs_and_gradients_match_the_separate_layers(grouped, bias, shared_casts):
    reference, patched = _pair(bias, shared_casts)
    x_ref = torch.randn(2, 5, 32, requires_grad=True)
    x_new = x_ref.detach().clone().requires_grad_(True)
    expected, got = _run(reference, x_ref), _run(patched, x_new)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same products (CPU: the same kernel)
    # the input gradient: one sum of the three parts where autocast rounds each (within a bf16 rounding)
    torch.testing.assert_close(x_new.grad, x_ref.grad, rtol=0, atol=1e-2 * x_ref.grad.abs().max().item())
    for name, param in patched.named_parameters():
        assert param.grad.dtype == torch.float32, name
        torch.testing.assert_close(param.grad, reference.get_parameter(name).grad, rtol=2e-2, atol=2e-3)
    assert patched.q_proj.linear_group.pending == {} and patched.q_proj.linear_group.source is None  # nothing kept


def test_the_group_runs_one_gemm_and_hands_the_others_their_outputs(grouped):
    _, patched = _pair(False, False)
    x = torch.randn(3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = patched.q_proj(x)
        assert set(patched.q_proj.linear_group.pending) == {1, 2}
        k = patched.k_proj(x)
        v = patched.v_proj(x)
    assert "GroupedLinear" in type(q.grad_fn).__name__
    assert q.shape == (3, 48) and k.shape == v.shape == (3, 16) and q.is_contiguous() and k.is_contiguous()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        other = patched.k_proj(torch.randn(3, 32))  # another input: computed afresh, not handed the old one
    assert not torch.equal(other, k)


def test_other_cases_keep_each_layer(grouped):
    _, patched = _pair(False, False)
    x = torch.randn(3, 32)
    assert patched.q_proj(x).dtype == torch.float32  # no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        assert patched.q_proj(x).grad_fn is None and patched.q_proj.linear_group.pending == {}
    patched.k_proj.requires_grad_(False)  # a frozen member: each layer on its own
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "GroupedLinear" not in type(patched.q_proj(x).grad_fn).__name__


def test_a_deep_copy_uses_its_own_weights(grouped):
    _, patched = _pair(False, False)
    twin = copy.deepcopy(patched)
    with torch.no_grad():
        twin.k_proj.weight.mul_(3.0)
    x = torch.randn(3, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        twin.q_proj(x)
        twin_k = twin.k_proj(x)
        patched.q_proj(x)
        own_k = patched.k_proj(x)
    torch.testing.assert_close(twin_k.float(), own_k.float() * 3.0, rtol=2e-2, atol=1e-2)
    assert twin.k_proj.linear_group is not patched.k_proj.linear_group


def test_off_by_default_installs_nothing():
    assert grouped_linear.GROUPED_LINEARS is False
    assert use_grouped_linears(_Attention(False)) == 0


def test_the_tiny_qwen3_models_loss_and_gradients_match(monkeypatch, tiny_qwen3):
    """The whole model, each decoder layer's q/k/v and gate/up grouped: the same loss, gradients within bf16
    roundings."""
    from transformers import AutoModelForCausalLM

    def loss_and_grads(on: bool):
        monkeypatch.setattr(grouped_linear, "GROUPED_LINEARS", on)
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
        use_autocast_linears(model)
        groups = use_grouped_linears(model)
        share_input_casts(model)
        ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return groups, loss.item(), {n: p.grad for n, p in model.named_parameters()}

    layers = AutoModelForCausalLM.from_pretrained(tiny_qwen3).config.num_hidden_layers
    none, loss_off, grads_off = loss_and_grads(False)
    groups, loss_on, grads_on = loss_and_grads(True)
    assert none == 0 and groups == 2 * layers
    assert loss_on == pytest.approx(loss_off, rel=1e-3)
    for name, grad in grads_off.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(grads_on[name], grad, rtol=0, atol=2e-2 * scale + 1e-8, msg=name)
