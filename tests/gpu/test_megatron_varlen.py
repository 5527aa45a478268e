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
