"""The model's repeated transformer blocks: what FSDP2 shards and `torch_compile: true` compiles one by one."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("tunesmith")

_BLOCK_LISTS = ("layers", "blocks")  # ModuleLists that hold transformer blocks (LM layers, ViT blocks)


def transformer_blocks(model) -> list[torch.nn.Module]:
    """Every block of every `layers`/`blocks` ModuleList (language model, vision tower, audio encoder)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in _BLOCK_LISTS:
            found.extend(module)
    return found


def compile_each(blocks: list[torch.nn.Module]) -> None:
    """torch.compile every block in place (dynamic shapes: packed rows change length every step)."""
    for block in blocks:
        block.compile(dynamic=True)
    log.info("torch_compile: compiling %d transformer blocks (the first steps include the compilation)", len(blocks))
