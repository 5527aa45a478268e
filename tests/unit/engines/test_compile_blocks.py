"""`torch_compile: true` compiles every transformer block on the single engine too (it was only read by FSDP2)."""

import torch
from transformers import AutoModelForCausalLM

from conftest import run_config
from tunesmith.engines import build_engine
from tunesmith.engines.blocks import transformer_blocks


def test_single_engine_compiles_each_block(tmp_path, tiny_qwen3):
    cfg = run_config(tmp_path, torch_compile=True, backend="single")
    engine = build_engine(cfg, lambda device, on_meta: AutoModelForCausalLM.from_pretrained(tiny_qwen3),
                          torch.device("cpu"), 4)
    blocks = transformer_blocks(engine.model)
    assert len(blocks) == engine.model.config.num_hidden_layers
    assert all(block._compiled_call_impl is not None for block in blocks)


def test_compiled_blocks_leave_out_ligers_block_kernels(monkeypatch, tiny_qwen3):
    """dynamo cannot trace Liger's RMSNorm (torch 2.11): under torch_compile the model class is not patched, and
    the compiled block fuses the norms, rotary and gated MLP itself (the fused linear + cross-entropy stays)."""
    from tunesmith.config import load as config_load
    from tunesmith.config.load import build_config
    from tunesmith.models import load

    monkeypatch.setattr(config_load, "_check_liger", lambda: [])
    patched = []
    monkeypatch.setattr(load, "_apply_liger_for", lambda path, cfg: patched.append(path))
    cfg = build_config(None, {"dataset": "x", "model_name_or_path": str(tiny_qwen3), "enable_liger_kernel": True,
                              "torch_compile": True})
    load.load_model(cfg.model, torch.device("cpu"), compiled_blocks=True)
    assert patched == []
    load.load_model(cfg.model, torch.device("cpu"), compiled_blocks=False)
    assert patched == [str(tiny_qwen3)]
