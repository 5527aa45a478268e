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
