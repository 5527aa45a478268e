"""GPU: the Megatron engine's attention on packed rows in bf16 runs PyTorch's variable-length FlashAttention
(the single engine's kernel) and gives what SDPA with the block-diagonal mask gives: logits on every real token
and the gradients of the weights. Skipped without CUDA or megatron-core. On the device machine:

    source .device-wheels/activate.sh && python -m pytest -q -s tests/gpu/test_megatron_varlen.py
"""

import dataclasses

import pytest
import torch
import transformers

pytest.importorskip("megatron.core")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tunesmith.config.schema import MegatronConfig  # noqa: E402
from tunesmith.data.collate import collate_rows  # noqa: E402
from tunesmith.engines.megatron import attention  # noqa: E402
from tunesmith.engines.megatron.build import build_gpt, transformer_config  # noqa: E402
from tunesmith.engines.megatron.engine import load_hf_state  # noqa: E402
from tunesmith.engines.megatron.forward import lm_forward  # noqa: E402
from tunesmith.engines.megatron.rotary import RotaryAngles  # noqa: E402

SHAPE = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
             intermediate_size=1024, vocab_size=1024, max_position_embeddings=4096, tie_word_embeddings=False)


def _batch():
    """Two rows of 512: samples of 100, 250 and 150 tokens then padding; one of 300 then 212 more."""
    generator = torch.Generator().manual_seed(0)
    rows = [[100, 250, 150], [300, 212]]
    sample = lambda n: {"input_ids": torch.randint(0, 1024, (n,), generator=generator).tolist(),  # noqa: E731
                        "labels": [1] * n}
    return collate_rows([[sample(n) for n in row] for row in rows], pad_id=0, length=512).to("cuda")


def _run(model, batch, angles):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = lm_forward(model, batch, angles)
    real = batch.segment_ids_BT >= 0
    logits[real].float().logsumexp(-1).mean().backward()
    return logits[real].float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def test_varlen_attention_gives_the_masked_sdpa_logits_and_gradients(world_of_one, monkeypatch):
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(0)  # as the engine does on CUDA
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.Qwen3Config(**SHAPE))
    model = build_gpt(hf.config, transformer_config(hf.config, MegatronConfig(), params_dtype=torch.float32))
    load_hf_state(model, hf.state_dict(), hf.config)
    model = model.cuda().train()
    angles, batch = RotaryAngles.of(hf), _batch()
    calls = []
    kernel = attention.flash_varlen
    monkeypatch.setattr(attention, "flash_varlen", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    varlen_logits, varlen_grads = _run(model, batch, angles)
    assert len(calls) == SHAPE["num_hidden_layers"]  # the varlen kernel ran in every layer
    sdpa_logits, sdpa_grads = _run(model, dataclasses.replace(batch, cu_seqlens=None), angles)  # the dense mask
    assert len(calls) == SHAPE["num_hidden_layers"]
    torch.testing.assert_close(varlen_logits, sdpa_logits, rtol=0.02, atol=0.02)
    for name, grad in sdpa_grads.items():
        cosine = torch.nn.functional.cosine_similarity(varlen_grads[name].flatten(), grad.flatten(), dim=0)
        assert cosine > 0.99, (name, cosine.item())


@pytest.mark.parametrize("size", [2, 4])
def test_context_parallel_flash_segments_give_the_whole_rows_attention(monkeypatch, size):
    """Under context parallelism each rank's queries through FlashAttention over context_parallel.varlen_plan's
    segments (keys picked from every rank's, gathered) give the whole row's masked attention at its positions, and
    the same gradients: the kernel aligns the causal mask to each segment's last key. The ranks are simulated in one
    process (the gather is a reindexing)."""
    import torch.nn.functional as F

    from tunesmith.engines.megatron import context_parallel
    from tunesmith.engines.megatron.forward import packed_causal_mask
    from tunesmith.models.attention import flash_varlen

    length, heads, groups, dim = 1024, 8, 2, 64
    segments = torch.tensor([[0] * 100 + [1] * 600 + [2] * 300 + [-1] * 24, [0] * 1000 + [-1] * 24],
                            device="cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(length, 2, heads, dim, device="cuda", generator=generator, dtype=torch.bfloat16)
    k, v = (torch.randn(length, 2, groups, dim, device="cuda", generator=generator, dtype=torch.bfloat16)
            for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_(True)
    as_bhtd = lambda t, repeat=1: t.permute(1, 2, 0, 3).repeat_interleave(repeat, dim=1)  # noqa: E731
    whole = F.scaled_dot_product_attention(as_bhtd(q), as_bhtd(k, heads // groups), as_bhtd(v, heads // groups),
                                           attn_mask=~packed_causal_mask(segments)).permute(2, 0, 1, 3)
    grad = torch.randn_like(whole)
    expected = torch.autograd.grad(whole, (q, k, v), grad)
    positions = context_parallel.block_positions(length, size).cuda()
    outs, grads = [], [torch.zeros_like(t) for t in (q, k, v)]
    for rank in range(size):
        monkeypatch.setattr(context_parallel, "cp_rank", lambda: rank)
        monkeypatch.setattr(context_parallel, "cp_size", lambda: size)
        plan = context_parallel.varlen_plan(segments, torch.device("cuda"))
        mine = q[positions[rank]]  # [T / CP, B, H, D]
        gathered_k, gathered_v = k[positions.flatten()], v[positions.flatten()]
        picked_k, picked_v = (t.reshape(-1, groups, dim).index_select(0, plan.key_index)
                              for t in (gathered_k, gathered_v))
        out = flash_varlen(mine.transpose(0, 1).reshape(-1, heads, dim), picked_k, picked_v, plan.cu_seqlens_q,
                           plan.max_seqlen_q, cu_seqlens_k=plan.cu_seqlens_k, max_seqlen_k=plan.max_seqlen_k)
        out = out.view(2, length // size, heads, dim).transpose(0, 1)
        rank_grads = torch.autograd.grad(out, (q, k, v), grad[positions[rank]])
        grads = [total + part for total, part in zip(grads, rank_grads)]
        outs.append((positions[rank], out.detach()))
    for where, out in outs:
        real = segments[:, where].transpose(0, 1) >= 0
        torch.testing.assert_close(out[real].float(), whole.detach()[where][real].float(), rtol=2e-2, atol=2e-2)
    real = (segments >= 0).transpose(0, 1)
    for got, want in zip(grads, expected):
        error = float((got[real].float() - want[real].float()).norm() / want[real].float().norm())
        assert error < 2e-2, error
