"""models/fused_projections.py: the stacked q/k/v and gate/up matmuls give the separate linears' outputs and
gradients, in fp32 and under bf16 autocast, with biases, frozen weights and LoRA on top; weights that cannot be
stacked take the layers' own forwards. The Triton SwiGLU and the strided q/k norm it uses on CUDA are tested in
test_swiglu_triton.py and test_rms_norm_triton.py (and on a GPU in tests/gpu/test_step_sync_gpu.py)."""

import functools

import pytest
import torch
import transformers

from tunesmith.models import fused_projections
from tunesmith.models.autocast_linear import use_autocast_linears
from tunesmith.models.fused_projections import compute_dtype, fuse_projections, stacked_linear


def _linears(widths, bias=False, dtype=torch.float32):
    torch.manual_seed(sum(widths))
    return [torch.nn.Linear(24, w, bias=bias).to(dtype) for w in widths]


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_stacked_linear_equals_the_separate_linears(autocast, bias):
    linears = _linears((32, 16, 16), bias=bias)
    x = torch.randn(2, 5, 24, requires_grad=True)
    dys = [torch.randn(2, 5, m.out_features) for m in linears]

    def run(stacked: bool):
        x.grad = None
        for m in linears:
            m.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if stacked:  # stacked_linear computes in any dtype; the models stack only under autocast
                outs = stacked_linear(x, linears, torch.bfloat16 if autocast else torch.float32).split([32, 16, 16], -1)
            else:
                outs = [m(x) for m in linears]
        torch.autograd.backward(outs, [dy.to(outs[0].dtype) for dy in dys])
        grads = [x.grad] + [p.grad for m in linears for p in m.parameters()]
        return [o.detach() for o in outs], grads

    want_out, want_grads = run(False)
    got_out, got_grads = run(True)
    tol = 2e-2 if autocast else 1e-5
    for got, want in zip(got_out + got_grads, want_out + want_grads):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_frozen_weights_are_stacked_without_gradients_and_mixed_ones_are_not():
    linears = _linears((8, 8))
    for m in linears:
        m.requires_grad_(False)
    x = torch.randn(3, 24, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(linears, x) == torch.bfloat16
        out = stacked_linear(x, linears, compute_dtype(linears, x))
    out.float().sum().backward()
    assert all(m.weight.grad is None for m in linears)
    torch.testing.assert_close(x.grad, sum(m.weight.sum(0) for m in linears).expand(3, 24), rtol=2e-2, atol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(_linears((8,)) + _linears((8,), dtype=torch.bfloat16), x) is None
        assert compute_dtype(_linears((8,)) + _linears((8,), bias=True), x) is None
        assert compute_dtype(_linears((8, 8), dtype=torch.bfloat16), x) is None  # pure bf16: nothing to cast
        linears[0].weight.requires_grad_(True)
        assert compute_dtype(linears, x) is None
    assert compute_dtype(_linears((8, 8)), x) is None  # no autocast: the stacked copy would be an extra one


def _tiny(model_type: str):
    if model_type == "qwen3":
        config = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=50,
                                          use_cache=False)
    else:  # Qwen2: biases on q/k/v, no q/k norms
        config = transformers.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                          use_cache=False)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def _loss_and_grads(model, ids, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2"])
@pytest.mark.parametrize("autocast", [False, True])
def test_a_model_with_stacked_projections_trains_as_before(model_type, autocast, monkeypatch):
    """Under autocast each layer's q/k/v and gate/up run stacked; without it (nothing to cast) apart."""
    plain, fused = _tiny(model_type), _tiny(model_type)
    for model in (plain, fused):
        use_autocast_linears(model)
    assert fuse_projections(fused) == 2 * 2
    calls = []
    stack = fused_projections.stacked_linear
    monkeypatch.setattr(fused_projections, "stacked_linear", lambda *a: calls.append(a) or stack(*a))
    ids = torch.randint(0, 50, (2, 11))
    want = _loss_and_grads(plain, ids, autocast)
    got = _loss_and_grads(fused, ids, autocast)
    assert len(calls) == (2 * 2 if autocast else 0)  # each layer's q/k/v and gate/up: one stacked matmul
    tol = 2e-2 if autocast else 1e-5
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    assert got[1].keys() == want[1].keys()
    for name, grad in want[1].items():
        error = float((got[1][name] - grad).norm() / grad.norm().clamp_min(1e-12))
        assert error < (5e-2 if autocast else 1e-4), (name, error)


def test_lora_over_stacked_projections_matches_lora_over_plain_ones(monkeypatch):
    """LoRA applied after the stacking (the engines apply it before, so LoRA'd layers are never stacked): a wrapped
    q or v reads its plain layer's stacked output and adds its adapter, and the Qwen3 attention forward, which
    would compute q/k/v itself, hands a wrapped attention to transformers' forward."""
    from tunesmith.models import norms, qk_norm_rope

    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    plain, fused = _tiny("qwen3"), _tiny("qwen3")
    # the Qwen3 attention forward installed and its CUDA condition met, its kernel never to be reached
    monkeypatch.setattr(fused_projections, "_norms_and_rope_fusable", lambda attention: True)
    monkeypatch.setattr(norms, "_on_triton", lambda hidden: True)
    monkeypatch.setattr(qk_norm_rope, "qk_norm_rope", lambda *a: pytest.fail("LoRA's q/k/v were bypassed"))
    fuse_projections(fused)
    assert all(isinstance(layer.self_attn.forward, functools.partial) for layer in fused.model.layers)
    models = []
    for model in (plain, fused):
        torch.manual_seed(1)
        models.append(peft.get_peft_model(model, config))
    ids = torch.randint(0, 50, (2, 9))
    want, got = (_loss_and_grads(m, ids, autocast=True) for m in models)
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    assert got[1].keys() == want[1].keys() and all("lora_" in name for name in want[1])
    for name, grad in want[1].items():
        error = float((got[1][name] - grad).norm() / grad.norm().clamp_min(1e-12))
        assert error < 5e-2, (name, error)


def test_gate_and_up_are_stacked_whatever_down_proj_is(monkeypatch):
    """down_proj reads the stacked pair's output as any input: a LoRA-wrapped down_proj (adapters applied before the
    install) leaves gate/up stacked, and the adapter trains as over the plain model."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["down_proj"], init_lora_weights=False)
    models = []
    for stack in (False, True):
        torch.manual_seed(1)
        model = peft.get_peft_model(_tiny("qwen3"), config)
        use_autocast_linears(model)
        if stack:
            assert fuse_projections(model) == 2 * 2
        models.append(model)
    calls = []
    stack = fused_projections.stacked_linear
    monkeypatch.setattr(fused_projections, "stacked_linear", lambda *a: calls.append(a) or stack(*a))
    ids = torch.randint(0, 50, (2, 9))
    want, got = (_loss_and_grads(m, ids, autocast=True) for m in models)
    assert len(calls) == 2 * 2
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    assert got[1].keys() == want[1].keys() and all("lora_" in name for name in want[1])
    for name, grad in want[1].items():
        error = float((got[1][name] - grad).norm() / grad.norm().clamp_min(1e-12))
        assert error < 5e-2, (name, error)


def test_a_call_on_another_input_runs_the_layer_itself():
    model = _tiny("qwen3")
    fuse_projections(model)
    attention = model.model.layers[0].self_attn
    x, other = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    q = attention.q_proj(x)
    k = attention.k_proj(other)  # not the input q/k/v were computed for
    torch.testing.assert_close(q, torch.nn.functional.linear(x, attention.q_proj.weight))
    torch.testing.assert_close(k, torch.nn.functional.linear(other, attention.k_proj.weight))
    torch.testing.assert_close(attention.v_proj(x), torch.nn.functional.linear(x, attention.v_proj.weight))


@pytest.mark.parametrize("liger", [True, False])
def test_the_single_engine_stacks_projections_with_the_fast_kernels(tmp_path, tiny_qwen3, liger, monkeypatch):
    """`enable_liger_kernel: true` (the set of fused kernels) stacks them on the single engine; without it the
    layers keep their own forwards."""
    from conftest import run_config
    from tunesmith.config import load as config_load
    from tunesmith.engines import build_engine

    monkeypatch.setattr(config_load, "_check_liger", lambda: [])
    cfg = run_config(tmp_path, backend="single", enable_liger_kernel=liger)
    engine = build_engine(cfg, lambda device, on_meta: transformers.AutoModelForCausalLM.from_pretrained(tiny_qwen3),
                          torch.device("cpu"), 4)
    layer = engine.model.model.layers[0]
    stacked = [isinstance(m.forward, functools.partial)
               for m in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp)]
    assert stacked == [liger] * 3


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2_5_vl", "qwen3_vl"])
def test_the_tiny_families_with_stacked_projections_train_as_before(arch, tiny_cache):
    """Every family of models/norms.PRE_NORM_LAYERS that the tiny models cover: the decoder layers are stacked and
    a text batch gives the same loss and gradients (the vision towers keep their own layers)."""
    from tunesmith.models.tiny import build_tiny

    path = build_tiny(arch, tiny_cache)
    auto = transformers.AutoModelForImageTextToText if "vl" in arch else transformers.AutoModelForCausalLM
    plain, fused = (auto.from_pretrained(path) for _ in range(2))
    layers = plain.config.get_text_config().num_hidden_layers
    assert fuse_projections(fused) == 2 * layers
    vocab = plain.config.get_text_config().vocab_size
    ids = torch.randint(3, min(vocab, 200), (2, 13))
    want, got = (_loss_and_grads(m, ids, autocast=True) for m in (plain, fused))
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)
    for name, grad in want[1].items():
        error = float((got[1][name] - grad).norm() / grad.norm().clamp_min(1e-12))
        assert error < 5e-2, (name, error)


def test_a_deep_copy_stacks_its_own_weights():
    """DPO's frozen reference (engines/reference.py) is a deep copy of the stacked model: its forwards must read
    the copy's weights, not the policy's."""
    import copy

    model = _tiny("qwen3")
    fuse_projections(model)
    ids = torch.randint(0, 50, (1, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids).logits.float().sum().backward()  # leaves nothing behind in the groups to copy
        frozen = copy.deepcopy(model).requires_grad_(False)
        want = frozen(input_ids=ids).logits
        with torch.no_grad():
            for layer in model.model.layers:
                for linear in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp.up_proj):
                    linear.weight.mul_(3.0)
        torch.testing.assert_close(frozen(input_ids=ids).logits, want)
        assert not torch.allclose(model(input_ids=ids).logits, want)


def test_inference_mode_and_a_second_install():
    """Inference tensors keep no version counter (the group compares versions); installing twice changes nothing."""
    model = _tiny("qwen2")
    assert fuse_projections(model) == 2 * 2
    assert fuse_projections(model) == 0
    ids = torch.randint(0, 50, (1, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(input_ids=ids).logits
        with torch.inference_mode():
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, want)
