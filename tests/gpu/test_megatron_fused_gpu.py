"""GPU: the Megatron engine's fused kernels (engines/megatron/fused.py) give what megatron-core's unfused local spec
gives: the Triton SwiGLU against silu(gate) * up, Liger's RoPE on [T, B, heads, D] against megatron-core's
apply_rotary_pos_emb, and a whole model's logits and gradients with every fused part on against all off. Skipped
without CUDA or megatron-core (the RoPE parts without Liger). On the device machine:

    source .device-wheels/activate.sh && python -m pytest -q -s tests/gpu/test_megatron_fused_gpu.py
"""

import pytest
import torch
import torch.nn.functional as F
import transformers

pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tunesmith.engines.megatron import forward as megatron_forward  # noqa: E402
from tunesmith.engines.megatron import fused  # noqa: E402
from tunesmith.models import norms  # noqa: E402

from test_megatron_varlen import SHAPE, _batch, _run  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_swiglu_matches_pytorch_on_cuda(dtype):
    from tunesmith.models.swiglu_triton import swiglu

    torch.manual_seed(0)
    x = (torch.randn(1000, 2, 2 * 3072, device="cuda") * 3).to(dtype).requires_grad_()
    dy = torch.randn(1000, 2, 3072, device="cuda", dtype=dtype)
    gate, up = torch.chunk(x.float(), 2, dim=-1)
    want = F.silu(gate) * up
    want_grad, = torch.autograd.grad(want, x, dy.float())
    got = swiglu(x)
    got.backward(dy)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(x.grad.float(), want_grad.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("batch", [2, 1])  # 1: one row (forward.as_one_row), where Liger could write in place
def test_liger_rope_on_megatron_layout_matches_megatron_cores_rotary(world_of_one, batch):
    """...and leaves its inputs unchanged: selective recomputation runs the core attention again on them."""
    pytest.importorskip("liger_kernel")
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.transformer.transformer_config import TransformerConfig

    length, heads, groups, dim = 700, 16, 8, 128
    config = TransformerConfig(num_layers=1, hidden_size=heads * dim, num_attention_heads=heads)
    positions = torch.stack([torch.arange(length), torch.arange(length).remainder(300)])[:batch].cuda()  # [B, T]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    half = positions.float()[..., None] * inv_freq
    freqs = torch.cat([half, half], dim=-1).transpose(0, 1)[:, :, None, :].contiguous()  # [T, B, 1, D]
    torch.manual_seed(0)
    q = torch.randn(length, batch, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(length, batch, groups, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    want = [apply_rotary_pos_emb(t.float(), freqs, config=config) for t in (q, k)]
    want_grads = torch.autograd.grad(want, (q, k), (dq.float(), dk.float()))
    inputs = q.detach().clone(), k.detach().clone()
    got = fused.rope_qk(q, k, *fused.cos_sin(freqs))
    assert torch.equal(q, inputs[0]) and torch.equal(k, inputs[1])
    assert [t.shape for t in got] == [q.shape, k.shape]
    got_grads = torch.autograd.grad(got, (q, k), (dq.clone(), dk.clone()))
    for g, w in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)


def test_a_model_with_the_fused_parts_gives_the_unfused_logits_and_gradients(world_of_one, monkeypatch):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from tunesmith.config.schema import MegatronConfig
    from tunesmith.engines.megatron.build import build_gpt, transformer_config
    from tunesmith.engines.megatron.engine import load_hf_state
    from tunesmith.engines.megatron.rotary import RotaryAngles

    model_parallel_cuda_manual_seed(0)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**SHAPE))
    model = build_gpt(hf.config, transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32))
    load_hf_state(model, hf.state_dict(), hf.config)
    model = model.cuda().train()
    assert all(isinstance(layer.mlp.activation_func, fused.FusedSwiGLU) for layer in model.decoder.layers)
    angles, batch = RotaryAngles.of(hf), _batch()
    rotated = []
    rope = fused.rope_qk
    monkeypatch.setattr("tunesmith.engines.megatron.attention.rope_qk",
                        lambda *a: rotated.append(1) or rope(*a))
    fused_logits, fused_grads = _run(model, batch, angles)
    assert len(rotated) == (SHAPE["num_hidden_layers"] if fused.rope_available() else 0)

    monkeypatch.setattr(norms, "TRITON_NORMS", False)
    monkeypatch.setattr(fused.FusedSwiGLU, "forward", lambda self, x: F.silu(x.chunk(2, -1)[0]) * x.chunk(2, -1)[1])
    monkeypatch.setattr(megatron_forward, "rope_available", lambda: False)
    plain_logits, plain_grads = _run(model, batch, angles)
    assert len(rotated) == (SHAPE["num_hidden_layers"] if fused.rope_available() else 0)
    torch.testing.assert_close(fused_logits, plain_logits, rtol=0.02, atol=0.02)
    for name, grad in plain_grads.items():
        cosine = F.cosine_similarity(fused_grads[name].flatten(), grad.flatten(), dim=0)
        assert cosine > 0.99, (name, cosine.item())
