"""The Hugging Face model each process reads its shards from: host memory for it, taken in turns and given back.

Every process builds the whole Hugging Face model on the CPU (fp32: 4 bytes a parameter, more while a bf16
checkpoint is upcast) and copies its shard into megatron-core's modules. Eight processes of a 30B model at once
would need about 1 TB of host memory. So:
- the processes of a node build their template in turns, as many at once as the available host memory holds
  (`ranks_at_once`, `in_turns`);
- after its turn every process but the main one drops the template's parameters (`release`): the main process
  keeps its own, which writes the Hugging Face checkpoint at every save (MegatronEngine.export_hf). A vision
  tower the megatron model shares with the template is kept (it trains);
- a resume reads the checkpoint into the template again (`refill`, in turns too), then releases it; a LoRA
  run's checkpoint holds only the adapters, so only they get memory, and the frozen base in megatron-core's
  modules stays as built.
"""

from __future__ import annotations

import logging
import os

import torch

from ... import dist

log = logging.getLogger("tunesmith")

UPCAST_OVERHEAD = 1.5  # a bf16 checkpoint is read as stored, then upcast to fp32: both copies for a moment
HEADROOM = 0.8  # of the memory available at the start


def template_bytes(meta_model: torch.nn.Module) -> int:
    """Host bytes one process needs to build the template (from the model on the meta device)."""
    size = sum(p.numel() * p.element_size() for p in meta_model.parameters())
    return int(size * UPCAST_OVERHEAD)


def ranks_at_once(needed: int) -> int:
    """How many processes of this node build their template at the same time: all of them when the available
    memory holds them, else as many as fit beside the main process's kept template (at least one)."""
    import psutil

    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world()))
    if local <= 1 or needed <= 0:
        return max(local, 1)
    available = psutil.virtual_memory().available * HEADROOM
    fit = int(available // needed) - 1  # one template stays with the main process
    at_once = dist.min_int(max(1, min(local, fit)))  # every process takes the same turns (their barriers match)
    if at_once < local:
        log.info("Megatron: %d of this node's %d processes build the Hugging Face model on the CPU at a time "
                 "(%.1f GiB each, %.1f GiB available)", at_once, local, needed / 2**30, available / HEADROOM / 2**30)
    return at_once


def in_turns(work, at_once: int):
    """work() in this process's turn (its local rank // at_once); every process waits for every turn."""
    local_rank = int(os.environ.get("LOCAL_RANK", dist.rank()))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.world()))
    result = None
    for turn in range((local + at_once - 1) // at_once):
        if local_rank // at_once == turn:
            result = work()
        if at_once < local:
            dist.barrier()
    return result


def release(template: torch.nn.Module, *keep: torch.nn.Module) -> None:
    """Drop the template's parameters (to the meta device), except those a module in `keep` holds too."""
    kept = {id(p) for module in keep if module is not None for p in module.parameters()}
    for module in template.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and id(param) not in kept and not param.is_meta:
                module._parameters[name] = torch.nn.Parameter(param.detach().to("meta"),
                                                              requires_grad=param.requires_grad)


def refill(template: torch.nn.Module, *, adapters_only: bool = False) -> None:
    """Give released parameters CPU memory again (uninitialised: a checkpoint is read into them next); with
    adapters_only, only the LoRA adapters' (an adapter checkpoint holds nothing else)."""
    for module_name, module in template.named_modules():
        if adapters_only and ".lora_" not in f".{module_name}":
            continue
        for name, param in list(module._parameters.items()):
            if param is not None and param.is_meta:
                module._parameters[name] = torch.nn.Parameter(torch.empty_like(param, device="cpu"),
                                                              requires_grad=param.requires_grad)


def is_released(template: torch.nn.Module) -> bool:
    return any(p.is_meta for p in template.parameters())
